"""ping: can every layer be reached? Run through the whole hop chain, this reports where it landed.

Run by hand: python3 ping.py  (prints the JSON result document's run() part)
"""

import json
import os
import platform
import socket
import sys
import tempfile


def build_parser():
    import argparse   # only here: through mldiag the client parses argv (bundle.parsed_args)
    return argparse.ArgumentParser(prog="ping.py", description=__doc__.splitlines()[0])


def user_name():
    """Who this process runs as, from its uid and this system's user database. Not
    ``getpass.getuser()``: that believes $LOGNAME/$USER first, which a hop passes through
    (``pct exec`` keeps the host's environment, ``su`` keeps $USER): uid 0 in a CT read as the
    host's login user. A uid with no entry here (a container without that user) is ``uid N``."""
    uid = os.getuid()
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "uid %d" % uid


def run(args):
    # Under mldiag the runtime names its private temp dir; by hand there is none to check.
    here = os.environ.get("MLDIAG_TMPDIR")
    mode = oct(os.stat(here).st_mode & 0o777) if here else None
    data = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
        "user": user_name(),
        "uid": os.getuid() if hasattr(os, "getuid") else None,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "tmpdir": here,
        "tmpdir_mode": mode,
        "temp_root": tempfile.gettempdir(),
    }
    findings = []
    if here and mode != "0o700":
        findings.append({"level": "fail", "code": "tmpdir-not-private",
                         "message": "private temp dir %s has mode %s, expected 0o700" % (here, mode)})
    venv = " (venv)" if data["venv"] else ""
    summary = "python %s%s as %s on %s" % (data["python"], venv, data["user"], data["hostname"])
    return {"summary": summary, "findings": findings, "data": data}


if __name__ == "__main__":
    result = run(build_parser().parse_args())
    print(json.dumps(result, indent=2))
    sys.exit(0 if not result["findings"] else 2)
