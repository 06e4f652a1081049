"""`python -m tests.lab`: start a lab, print how to reach it, keep it up until Ctrl-C
(or for --seconds), then tear it down."""

import argparse
import signal
import sys
import time

from . import Lab


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long (default: until Ctrl-C)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    lab = Lab.start()
    try:
        print(lab.summary(), flush=True)
        if args.seconds is not None:
            time.sleep(args.seconds)
        else:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
