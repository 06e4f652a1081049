"""nccl-check's client side: the fleet judgement (``fleet.py``)."""
