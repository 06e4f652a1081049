"""Test users on the lab's ssh hosts, and the sudoers rules they get. Idempotent."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Dict, Iterable, NamedTuple

from .util import LabError, run


class LabUser(NamedTuple):
    name: str
    shell: str
    sudo: bool  # NOPASSWD rule for everything


USERS: Dict[str, LabUser] = {
    u.name: u for u in (
        LabUser("mlsh", "/bin/sh", True),
        LabUser("mlzsh", "/usr/bin/zsh", True),
        LabUser("nosudo", "/bin/sh", False),
    )
}

SUDOERS_FILE = Path("/etc/sudoers.d/mldiag-lab")


def _shadow_hash(name: str) -> str:
    for line in Path("/etc/shadow").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return fields[1]
    raise LabError(f"user {name} has no /etc/shadow entry")


def ensure_user(user: LabUser) -> pwd.struct_passwd:
    """Create `user` if missing; fix its shell; make it passwordless but not locked ('*')."""
    try:
        entry = pwd.getpwnam(user.name)
    except KeyError:
        run(["useradd", "--create-home", "--user-group", "--shell", user.shell, user.name])
        entry = pwd.getpwnam(user.name)
    if entry.pw_shell != user.shell:
        run(["usermod", "--shell", user.shell, user.name])
    # NOTE: useradd leaves the account locked ('!'), which sshd refuses under UsePAM no.
    if _shadow_hash(user.name) != "*":
        run(["usermod", "-p", "*", user.name])
    entry = pwd.getpwnam(user.name)
    home = Path(entry.pw_dir)
    if not home.is_dir():
        home.mkdir(mode=0o755, parents=True)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    if user.shell.endswith("zsh"):
        zshrc = home / ".zshrc"
        if not zshrc.exists():  # an empty rc keeps zsh-newuser-install quiet
            zshrc.touch()
            os.chown(zshrc, entry.pw_uid, entry.pw_gid)
    return entry


def ensure_users(users: Iterable[LabUser] = USERS.values()) -> Dict[str, pwd.struct_passwd]:
    return {u.name: ensure_user(u) for u in users}


def sudoers_text(users: Iterable[LabUser], secure_path: str, env_keep: Iterable[str]) -> str:
    users = list(users)
    names = ",".join(u.name for u in users)
    lines = [
        "# Written by the mldiag test lab (tests/lab/users.py); rewritten each lab session.",
        f'Defaults:{names} secure_path="{secure_path}"',
    ]
    keep = " ".join(env_keep)
    if keep:
        lines.append(f'Defaults:{names} env_keep += "{keep}"')
    lines += [f"{u.name} ALL=(ALL:ALL) NOPASSWD: ALL" for u in users if u.sudo]
    return "\n".join(lines) + "\n"


def install_sudoers(text: str, path: Path = SUDOERS_FILE) -> None:
    """Check `text` with visudo, then put it in place atomically (mode 0440)."""
    tmp = path.with_name("." + path.name + ".tmp")  # a dotted name: sudo skips it
    tmp.write_text(text)
    os.chmod(tmp, 0o440)
    try:
        run(["visudo", "-c", "-q", "-f", str(tmp)])
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
