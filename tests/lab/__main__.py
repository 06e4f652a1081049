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
    ap.add_argument("--node-check", action="store_true",
                    help="also start the node-check CTs 210 h200-ok and 211 h200-bad (tests/lab/nodecheck.py)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    lab = Lab.start()
    try:
        if args.node_check:
            lab.node_check_cts()
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
