"""scan-log on recorded log snippets (tests/fixtures/logs/).

Expected counts and line numbers were written by hand from the fixtures
(``grep -n`` on the files), not computed by the classifier.
"""

import argparse
import ast
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.programs import load_module, load_script
from tests.programs import script_imports

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "diagnostics" / "scripts" / "scan_log.py"
LOGS = ROOT / "tests" / "fixtures" / "logs"
KINDS = ["traceback", "empty-error", "nan-loss", "cuda-oom", "nccl", "xid-fatal", "xid", "killed"]


sl = load_script("scan_log.py", "mldiag_test_scan_log")


def scan(path, lines=2000, **kw):
    return sl.run(argparse.Namespace(path=str(path), lines=lines, **kw))


def lines_of(result, kind):
    return [e["line"] for e in result["data"]["matches"][kind]]


# fixture -> (status, {kind: [line numbers]}) -- every kind not listed has no match
EXPECTED = {
    "torch_nccl_timeout.log": ("fail", {
        "traceback": [12, 13, 58],
        "nccl": [28, 29, 38, 39, 40, 41, 42, 43, 44, 45, 52, 53],
    }),
    "vllm_engine_traceback.log": ("fail", {
        "traceback": [17, 41, 56, 70],
    }),
    "extract_empty_errors.log": ("fail", {
        "traceback": [12, 21, 42],
        "empty-error": [5, 7, 8, 9],
    }),
    "hf_trainer_nan_loss.log": ("fail", {
        "nan-loss": [11, 12, 14, 18, 19, 20, 21],
    }),
    "fsdp_cuda_oom.log": ("fail", {
        "traceback": [6],
        "cuda-oom": [3, 18],
    }),
    "dmesg_xid.log": ("fail", {
        "xid-fatal": [7, 14, 18],
        "xid": [5, 6, 12, 13, 19],
        "killed": [15, 16],
    }),
    # the driver's "fallen off the bus" words without an Xid line, and NVLink5 Xids (README.md)
    "dmesg_fallen_off_bus.log": ("fail", {
        "xid-fatal": [4, 7, 8, 10, 11, 13],
        "xid": [12, 14],
    }),
    "slurm_killed.log": ("fail", {
        "killed": [6, 12, 14, 15, 16, 17],
    }),
    "clean_training.log": ("ok", {}),
    # the trainers' own NaN/inf loss formats (README.md beside the fixtures says where each
    # line comes from); near-misses in the same files must not count
    "fairseq_nan_loss.log": ("fail", {
        "traceback": [10],
        "nan-loss": [5, 6, 7, 8, 9, 15],
    }),
    "megatron_nan_loss.log": ("fail", {
        "nan-loss": [3, 4, 5, 7, 8],
    }),
    "lightning_nan_loss.log": ("fail", {
        "nan-loss": [5, 6, 7, 8, 9],
    }),
    "nanogpt_nan_loss.log": ("fail", {
        "nan-loss": [8, 9, 10],
    }),
    "deepspeed_fp16_overflow.log": ("fail", {
        "traceback": [7],
        "nan-loss": [12],
    }),
    "misc_trainers_nan_loss.log": ("fail", {
        "nan-loss": [1, 2, 3, 4, 5, 6, 7, 8, 9],
    }),
}
LINE_COUNTS = {"torch_nccl_timeout.log": 89, "vllm_engine_traceback.log": 80,
               "extract_empty_errors.log": 48, "hf_trainer_nan_loss.log": 22,
               "fsdp_cuda_oom.log": 18, "dmesg_xid.log": 19, "slurm_killed.log": 17,
               "clean_training.log": 12, "fairseq_nan_loss.log": 16, "megatron_nan_loss.log": 8,
               "lightning_nan_loss.log": 11, "nanogpt_nan_loss.log": 11,
               "deepspeed_fp16_overflow.log": 12, "misc_trainers_nan_loss.log": 14,
               "dmesg_fallen_off_bus.log": 14}


def test_every_fixture_has_expectations():
    assert sorted(os.path.basename(p) for p in glob.glob(str(LOGS / "*.log"))) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_kinds_counts_and_lines(name):
    status, expected = EXPECTED[name]
    r = scan(LOGS / name)
    assert r["status"] == status
    d = r["data"]
    assert d["lines_scanned"] == LINE_COUNTS[name]
    assert (d["first_line"], d["last_line"]) == (1, LINE_COUNTS[name])
    assert d["line_numbers"] == "absolute" and d["window_truncated"] is False
    for kind in KINDS:
        assert lines_of(r, kind) == expected.get(kind, []), kind
        assert d["counts"][kind] == len(expected.get(kind, [])), kind
        assert d["omitted"][kind] == 0
    assert d["total"] == sum(len(v) for v in expected.values())
    # one finding per kind found, in the report order, each naming first and last line
    assert [f["code"] for f in r["findings"]] == [k for k in KINDS if k in expected]
    for f in r["findings"]:
        first, last = expected[f["code"]][0], expected[f["code"]][-1]
        assert "first at line %d" % first in f["message"]
        if len(expected[f["code"]]) > 1:
            assert "last at line %d" % last in f["message"]
        assert f["level"] == ("warn" if f["code"] == "xid" else "fail")
        assert f["hint"]


def test_nccl_fixture_tracebacks_per_rank_and_torchrun():
    r = scan(LOGS / "torch_nccl_timeout.log")
    tbs = r["data"]["matches"]["traceback"]
    assert [(t["line"], t["exception_line"], t["exception"]) for t in tbs] == [
        (12, 28, "torch.distributed.DistBackendError"),
        (13, 38, "torch.distributed.DistBackendError"),
        (58, 74, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"),
    ]
    # "ChildFailedError: " followed by a ruled block is a multi-line message, not an empty one
    assert tbs[2]["empty_message"] is False
    assert tbs[2]["message"] == "train.py FAILED"
    assert tbs[0]["message"].startswith("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356")
    assert r["summary"] == ("3 Python tracebacks, 12 NCCL/gloo error/timeout lines in all 89 lines of %s"
                            % (LOGS / "torch_nccl_timeout.log"))
    nccl = [f for f in r["findings"] if f["code"] == "nccl"][0]
    assert nccl["message"].startswith(
        "12 NCCL/gloo error/timeout lines \u2014 first at line 28: [rank0]: torch.distributed.DistBackendError: "
        "NCCL error in:")
    tb = [f for f in r["findings"] if f["code"] == "traceback"][0]
    assert "first at line 12 (exception at 28): torch.distributed.DistBackendError" in tb["message"]
    assert "last at line 58 (exception at 74): torch.distributed.elastic.multiprocessing.errors." \
           "ChildFailedError: train.py FAILED" in tb["message"]


def test_gloo_collective_timeout_is_a_collective_failure():
    """A real gloo hang (tests/fixtures/stacks/gloo_timeout.log: the hung 4-rank job with an 8 s
    timeout): ranks 0-2 time out in all_reduce, torchrun then ends rank 3."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / "stacks" / "gloo_timeout.log"
    r = scan(path)
    assert [e["line"] for e in r["data"]["matches"]["nccl"]] == [21, 34, 47]
    nccl = [f for f in r["findings"] if f["code"] == "nccl"][0]
    assert nccl["message"].startswith("3 NCCL/gloo error/timeout lines \u2014 first at line 21: [rank2]: "
                                      "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
                                      "tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation")
    tbs = r["data"]["matches"]["traceback"]
    assert [(t["line"], t["exception"]) for t in tbs][:3] == [(9, "RuntimeError"), (22, "RuntimeError"),
                                                             (35, "RuntimeError")]
    # the words alone, outside gloo's own message, are not a collective timeout
    assert not sl._is_nccl("Timed out waiting 8000ms for recv operation", "timed out waiting")


def test_vllm_fixture_logged_tracebacks_with_prefixes_and_ticking_clock():
    r = scan(LOGS / "vllm_engine_traceback.log")
    tbs = r["data"]["matches"]["traceback"]
    assert [(t["line"], t["exception_line"], t["exception"], t["message"]) for t in tbs] == [
        (17, 35, "RuntimeError", "CUDA error: an illegal memory access was encountered"),
        (41, 50, "RuntimeError", "Worker failed with error 'CUDA error: an illegal memory access was encountered"),
        (56, 65, "RuntimeError", "Worker failed with error 'CUDA error: an illegal memory access was encountered"),
        (70, 78, "RuntimeError",
         "Engine core initialization failed. See root cause above. Failed core proc(s): {}"),
    ]
    assert not any(t["empty_message"] for t in tbs)


def test_empty_message_fixture():
    r = scan(LOGS / "extract_empty_errors.log")
    tbs = r["data"]["matches"]["traceback"]
    assert [(t["line"], t["exception_line"], t["text"]) for t in tbs] == [
        (12, 19, "AssertionError (empty message)"),
        (21, 39, "RuntimeError: (empty message)"),
        (42, 48, "ValueError (empty message)"),
    ]
    assert all(t["empty_message"] and t["message"] == "" for t in tbs)
    # the chained traceback is one, ending in its last exception, remembering the first
    assert tbs[1]["chained_from"] == ["KeyError: 'model.layers.64'"]
    assert [e["text"] for e in r["data"]["matches"]["empty-error"]] == [
        "ERROR in batch 0-3:", "ERROR in batch 4-7:",
        "2026-05-02 11:00:45,120 ERROR extract: batch 8-11 failed:", "ERROR:root:"]
    by_code = {f["code"]: f for f in r["findings"]}
    assert by_code["empty-error"]["message"] == (
        "4 ERROR lines with an empty message \u2014 first at line 5: ERROR in batch 0-3:; "
        "last at line 9: ERROR:root:")
    assert by_code["traceback"]["message"] == (
        "3 Python tracebacks (3 with an empty exception message) \u2014 first at line 12 "
        "(exception at 19): AssertionError (empty message); last at line 42 (exception at 48): "
        "ValueError (empty message)")
    assert "repr(e)" in by_code["traceback"]["hint"]
    assert r["summary"].startswith("3 Python tracebacks, 4 ERROR lines with an empty message in all 48 lines")


def test_xid_fixture_numbers_devices_and_levels():
    r = scan(LOGS / "dmesg_xid.log")
    m = r["data"]["matches"]
    assert [(e["xid"], e["device"]) for e in m["xid-fatal"]] == [
        (79, "0000:5d:00"), (74, "0000:18:00"), (48, "0000:bb:00")]
    assert [(e["xid"], e["device"]) for e in m["xid"]] == [
        (13, "0000:3b:00"), (31, "0000:3b:00"), (94, "0000:9a:00"), (63, "0000:9a:00"), (13, "0000:3b:00")]
    xid = [f for f in r["findings"] if f["code"] == "xid"][0]
    assert xid["level"] == "warn"
    assert xid["message"].startswith(
        "5 Xid lines (Xid 13 on 0000:3b:00 \u00d72, 31 on 0000:3b:00, 94 on 0000:9a:00, 63 on 0000:9a:00)")
    fatal = [f for f in r["findings"] if f["code"] == "xid-fatal"][0]
    assert fatal["message"].startswith(
        "3 fatal Xid lines (Xid 79 on 0000:5d:00, 74 on 0000:18:00, 48 on 0000:bb:00)")


def test_every_finding_has_its_action():
    """The job's failures are ``app``; the Xid findings take the worst action of their Xids from
    xid_catalog.json: 79 (reboot) > 74, 48 (reset-gpu); 13, 31, 94 (app) > 63 (monitor)."""
    r = scan(LOGS / "dmesg_xid.log")
    assert [(f["code"], f["action"]) for f in r["findings"]] == [
        ("xid-fatal", "reboot"), ("xid", "app"), ("killed", "app")]
    for name in EXPECTED:
        for f in scan(LOGS / name)["findings"]:
            assert f["action"] == ("app" if not f["code"].startswith("xid") else f["action"]), (name, f)


def test_dbe_with_a_row_remap_on_the_same_gpu_drains():
    """tests/fixtures/xid's ISO log: Xid 48 and 63 on 0000:19:00 -> NVIDIA's DRAIN_AND_RESET."""
    r = scan(ROOT / "tests" / "fixtures" / "xid" / "gpud-dmesg-time-format-iso.log")
    assert [(f["code"], f["level"], f["action"]) for f in r["findings"]] == [
        ("xid-fatal", "fail", "drain"), ("xid", "warn", "app")]
    assert r["findings"][0]["message"].startswith("1 fatal Xid line (Xid 48 on 0000:19:00)")


def test_without_xid_py_beside_it_xids_are_unclassified(tmp_path):
    alone = tmp_path / "scan_log.py"
    alone.write_text(SCRIPT.read_text())
    lone = load_module(alone, "mldiag_test_scan_log_alone")
    log = tmp_path / "k.log"
    log.write_text("[ 3.0] NVRM: Xid (PCI:0000:ba:00): 79, pid=1, GPU has fallen off the bus.\n")
    r = lone.run(argparse.Namespace(path=str(log), lines=100))
    (f,) = r["findings"]
    assert (f["code"], f["level"], f["action"]) == ("xid", "warn", "monitor")
    assert f["message"].startswith("1 Xid line (Xid 79 on 0000:ba:00) (catalog not shipped)")


def test_nonfatal_xid_alone_is_warn(tmp_path):
    p = tmp_path / "k.log"
    p.write_text("[  12.3] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=python, Graphics Exception\n")
    r = scan(p)
    assert r["status"] == "warn"
    assert [f["code"] for f in r["findings"]] == ["xid"]


def test_oom_fixture():
    r = scan(LOGS / "fsdp_cuda_oom.log")
    (tb,) = r["data"]["matches"]["traceback"]
    assert (tb["exception"], tb["exception_line"]) == ("torch.OutOfMemoryError", 18)
    assert tb["message"].startswith("CUDA out of memory. Tried to allocate 20.00 GiB.")
    # matched lines are kept bounded
    assert all(len(e["text"]) <= sl.MAX_TEXT for e in r["data"]["matches"]["cuda-oom"])


def test_clean_log_is_ok():
    r = scan(LOGS / "clean_training.log")
    assert r["status"] == "ok" and r["findings"] == []
    assert r["summary"] == "no problems in all 12 lines of %s" % (LOGS / "clean_training.log")


# --------------------------------------------------------------------------- classification details

def test_source_lines_inside_a_traceback_are_not_classified(tmp_path):
    p = tmp_path / "t.log"
    p.write_text(
        "Traceback (most recent call last):\n"
        '  File "t.py", line 3, in <module>\n'
        '    log.info(f"loss=nan, NCCL error, CUDA out of memory, Killed")\n'
        '  File "t.py", line 9, in f\n'
        "    for x in xs:\n"
        "ZeroDivisionError: division by zero\n")
    r = scan(p)
    assert {k: v for k, v in r["data"]["counts"].items() if v} == {"traceback": 1}
    (tb,) = r["data"]["matches"]["traceback"]
    assert (tb["exception"], tb["message"], tb["empty_message"]) == (
        "ZeroDivisionError", "division by zero", False)


def test_exception_line_itself_is_classified(tmp_path):
    p = tmp_path / "t.log"
    p.write_text("Traceback (most recent call last):\n"
                 '  File "t.py", line 3, in <module>\n'
                 "    x = torch.empty(10**12, device='cuda')\n"
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.64 TiB.\n")
    r = scan(p)
    assert lines_of(r, "traceback") == [1]
    assert lines_of(r, "cuda-oom") == [4]


def test_traceback_cut_off_by_end_of_log(tmp_path):
    p = tmp_path / "t.log"
    p.write_text("Traceback (most recent call last):\n"
                 '  File "t.py", line 3, in <module>\n'
                 "    main()\n")
    (tb,) = scan(p)["data"]["matches"]["traceback"]
    assert tb["exception"] is None and tb["exception_line"] is None
    assert tb["text"] == "Traceback (most recent call last): (cut off before its exception line)"


def test_error_line_followed_by_traceback_is_not_an_empty_message(tmp_path):
    p = tmp_path / "t.log"
    p.write_text("ERROR in batch 0-3:\n"
                 "Traceback (most recent call last):\n"
                 '  File "t.py", line 3, in <module>\n'
                 "KeyError: 'x'\n"
                 "ERROR in batch 4-7:   \n"
                 "ERROR in batch 8-11: shape mismatch\n")
    r = scan(p)
    assert lines_of(r, "empty-error") == [5]


@pytest.mark.parametrize("line, empty", [
    ("Error in step 3:", True),                    # the capitalised word, not only ERROR
    ("2026-05-02 11:00:45,120 Error extract: batch 8-11 failed:", True),
    ("ERROR in batch 0-3:\t\t", True),             # trailing tabs are whitespace too
    ("Error in step 3:\t \t", True),
    ("ERROR in batch 0-3:\tshape mismatch", False),  # a message after a tab
    ("error in step 3:", False),                   # lower case is not the logging level
    ("ErrorHandler:", False),                      # not the word Error
    ("ERRORS:", False),
    ("Error in step 3: bad shape\t", False),
])
def test_empty_error_message_shapes(tmp_path, line, empty):
    p = tmp_path / "one.log"
    p.write_text(line + "\n")
    r = scan(p)
    assert lines_of(r, "empty-error") == ([1] if empty else [])
    assert r["status"] == ("fail" if empty else "ok")


@pytest.mark.parametrize("line, kind", [
    ("step 7 loss=nan lr=1e-4", "nan-loss"),
    ("{'loss': nan, 'epoch': 1.0}", "nan-loss"),
    ('{"loss": NaN}', "nan-loss"),
    ("epoch 3 | val_loss: inf", "nan-loss"),
    ("Loss is NaN, stopping training", "nan-loss"),
    # fairseq: simple (commas), epoch summary (pipes), json (quoted values), tqdm postfix
    ("2026-05-02 10:02:31 | INFO | train_inner | epoch 001:    200 / 1102 loss=nan, nll_loss=nan, ppl=nan",
     "nan-loss"),
    ("2026-05-02 10:05:02 | INFO | train | epoch 001 | loss nan | nll_loss nan | ppl nan | wps 59093", "nan-loss"),
    ("2026-05-02 10:05:02 | INFO | valid | epoch 001 | valid on 'valid' subset | loss inf | nll_loss inf",
     "nan-loss"),
    ('2026-05-02 10:03:52 | INFO | train_inner | {"epoch": 1, "update": 0.272, "loss": "nan", "nll_loss": "nan"}',
     "nan-loss"),
    ("epoch 002:  18%|\u258f| 1386/7494 [06:49<29:04,  3.50it/s, loss=nan, nll_loss=nan, ppl=nan]", "nan-loss"),
    ("FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. Try lowering "
     "the learning rate, using gradient clipping or increasing the batch size.", "nan-loss"),
    # Megatron-LM: "{:.6E}" of NaN/inf is NAN/INF; nan iterations counted; the NaN check's error
    (" iteration      200/  500000 | learning rate: 3.000000E-04 | global batch size:   256 | lm loss: NAN | "
     "loss scale: 1.0 | grad norm: nan | number of skipped iterations:   0 | number of nan iterations:   0 |",
     "nan-loss"),
    (" iteration      300/  500000 | lm loss: INF | loss scale: 1.0 |", "nan-loss"),
    (" iteration      300/  500000 | lm loss: nan | loss scale: 1.0 |", "nan-loss"),
    (" iteration      300/  500000 | lm loss: -inf | loss scale: 1.0 |", "nan-loss"),
    (" iteration      400/  500000 | loss scale: 1.0 | number of skipped iterations: 100 | "
     "number of nan iterations: 100 |", "nan-loss"),
    ("[rank12]: RuntimeError: Rank 12, node gpu05, device 4, iteration 612: Unexpected result nan "
     "(message='found NaN in local forward loss calculation')", "nan-loss"),
    ("AssertionError: Rank 0: found NaN in local forward loss calculation. Device: 0, node: gpu01", "nan-loss"),
    ("message='found Inf in local forward loss calculation'", "nan-loss"),
    # HF Trainer
    ("{'loss': nan, 'grad_norm': nan, 'learning_rate': 1.7e-05, 'epoch': 0.03}", "nan-loss"),
    ("{'eval_loss': inf, 'eval_runtime': 12.31, 'epoch': 0.04}", "nan-loss"),
    ("{'loss': 'nan', 'epoch': 0.03}", "nan-loss"),
    # tqdm postfixes; PyTorch Lightning's progress bar, EarlyStopping and finite-loss check
    ("100%|\u2588\u2588\u2588| 10/10 [00:01<00:00,  9.52it/s, loss=nan]", "nan-loss"),
    ("100%|\u2588\u2588\u2588| 10/10 [00:01<00:00,  9.52it/s, loss=inf]", "nan-loss"),
    ("Epoch 0: 100%|\u2588\u2588\u2588| 100/100 [00:20<00:00,  4.97it/s, v_num=3, train_loss=nan]", "nan-loss"),
    ("Epoch 1:  10%|\u2588 | 10/100 [00:02<00:18,  4.96it/s, v_num=3, train/loss=nan]", "nan-loss"),
    ("Epoch 1:  20%|\u2588\u2588 | 20/100 [00:04<00:16, v_num=3, train_loss_step=nan, train_loss_epoch=nan]",
     "nan-loss"),
    ("Monitored metric val_loss = tensor(nan, device='cuda:0') is not finite. Previous best value was 2.301. "
     "Signaling Trainer to stop.", "nan-loss"),
    ("ValueError: The loss returned in `training_step` is tensor(nan, device='cuda:0', "
     "grad_fn=<NllLossBackward0>).", "nan-loss"),
    ("ValueError: The loss returned in `training_step` is nan or inf.", "nan-loss"),
    # DeepSpeed's fp16 loss scaler giving up; Keras' TerminateOnNaN
    ("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.", "nan-loss"),
    ("Batch 12: Invalid loss, terminating training", "nan-loss"),
    # nanoGPT and other plain "loss nan" prints, brackets, casing, signs, spellings, wrappers
    ("iter 20: loss nan, time 40.51ms, mfu 9.27%", "nan-loss"),
    ("step 250: train loss nan, val loss nan", "nan-loss"),
    ("| E6 iter[ 14/ 15] | [Loss] nan | [step]   104 |", "nan-loss"),
    ("Epoch: [21][1401/1930]\tTime 0.754 (0.986)\tData 0.005 (0.009)\tLoss nan (nan)", "nan-loss"),
    ("2660/6659 [==========>....] - ETA: 7:48 - loss: nan - acc: 0.8350", "nan-loss"),
    ("Loss: NaN", "nan-loss"),
    ("loss = -inf", "nan-loss"),
    ("loss: +Infinity", "nan-loss"),
    ('{"step": 12, "loss": Infinity}', "nan-loss"),
    ("train_loss=tensor(inf, device='cuda:0')", "nan-loss"),
    ("loss=array(nan, dtype=float32)", "nan-loss"),
    ("loss: [nan]", "nan-loss"),
    ("grad_norm=nan loss_scale=inf loss=nan", "nan-loss"),     # a later key is found after earlier ones
    ("RuntimeError: CUDA error: out of memory", "cuda-oom"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory.", "cuda-oom"),
    ("RuntimeError: NCCL Error 1: unhandled cuda error", "nccl"),
    ("ncclInternalError: Internal check failed.", "nccl"),
    ("[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout", "nccl"),
    ("[rank0]:[E502 10:00:00.1 ProcessGroupNCCL.cpp:1412] [PG 0 Rank 0] ProcessGroupNCCL's watchdog got stuck for 480 seconds", "nccl"),
    ("Killed", "killed"),
    ("bash: line 1:  4242 Killed                  python train.py", "killed"),
    ("child process exited with exit code 137", "killed"),
    ("worker 3 died with <Signals.SIGKILL: 9>", "killed"),
])
def test_single_line_kinds(tmp_path, line, kind):
    p = tmp_path / "one.log"
    p.write_text(line + "\n")
    r = scan(p)
    assert [k for k in KINDS if r["data"]["counts"][k]] == [kind]


@pytest.mark.parametrize("line", [
    "loss_scale: inf",
    "Attempted loss scale: 65536, reducing to 32768",
    "step 3 loss=0.31 grad_norm=nan",
    "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "[rank0]:[I502 10:00:00.1 ProcessGroupNCCL.cpp:900] ProcessGroupNCCL initialization options: TIMEOUT(MS): 600000",
    "Out of memory check passed",
    "the info: loss=infinite_loop_guard",
    "Error rate: 0.1%",
    "slurmstepd: error: *** JOB 12 ON gpu05 CANCELLED AT 2026-05-02T10:00:00 ***",
    "exit code -6",
    # near-misses of the NaN/inf loss formats
    "nan_count=0",
    "skipped_nan_steps=3",
    "reading /data/loss_nan/run.log",
    "saved checkpoint /data/loss_nan/checkpoint_last.pt (epoch 1 @ 328 updates, score nan)",
    "loss_scale: 65536",
    "loss=0.5 nan_guard=on",
    "grad_norm: nan",                            # fp16 overflow: the step is skipped (module docstring)
    "step 3 | loss 0.31 | gnorm nan | loss_scale 0.125",
    "2026-05-02 10:01:40 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
    "setting loss scale to: 64.0",
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1",
    "[Rank 0] step=10, skipped=2, lr=[1.9e-05], mom=[(0.9, 0.999)]",
    " iteration      100/  500000 | lm loss: 7.123456E+00 | loss scale: 65536.0 | grad norm: 1.234 | "
    "number of skipped iterations:   3 | number of nan iterations:   0 |",
    "lm loss: 1.234567E+00",
    "iter 10: loss 3.2438, time 40.12ms",
    "loss nan_guard",
    "loss information: none",
    "val_loss=inference_only",
    "loss_nan=0",
    "Epoch 2: 30%| 30/100 [00:06<00:14, v_num=3, train_loss=0.500, nan_count=0, skipped_nan_steps=3]",
])
def test_lines_that_must_not_match(tmp_path, line):
    p = tmp_path / "one.log"
    p.write_text(line + "\n")
    r = scan(p)
    assert r["data"]["total"] == 0, r["data"]["matches"]
    assert r["status"] == "ok"


def test_matches_are_bounded_but_counted(tmp_path):
    p = tmp_path / "many.log"
    p.write_text("".join("step %d loss=nan\n" % i for i in range(1, 201)))
    r = scan(p)
    got = lines_of(r, "nan-loss")
    assert r["data"]["counts"]["nan-loss"] == 200
    assert got == list(range(1, sl.KEEP_HEAD + 1)) + list(range(201 - sl.KEEP_TAIL, 201))
    assert r["data"]["omitted"]["nan-loss"] == 200 - sl.KEEP_HEAD - sl.KEEP_TAIL
    (f,) = r["findings"]
    assert "first at line 1:" in f["message"] and "last at line 200:" in f["message"]


# --------------------------------------------------------------------------- reading

def test_missing_file_is_a_fail_finding_not_a_crash(tmp_path):
    missing = tmp_path / "nope.log"
    r = scan(missing)
    assert r["status"] == "fail"
    assert r["findings"] == [{"level": "fail", "code": "log-not-found",
                              "message": "log not found: %s" % missing,
                              "hint": "check the path on the target (it is resolved there, not locally)",
                              "action": "none"}]
    assert r["data"]["exists"] is False and r["data"]["total"] == 0
    assert list(r["data"]["counts"]) == KINDS


def test_directory_is_unreadable(tmp_path):
    r = scan(tmp_path)
    assert r["status"] == "fail"
    assert [f["code"] for f in r["findings"]] == ["log-unreadable"]
    assert r["findings"][0]["message"].startswith("log not readable: %s (" % tmp_path)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.log"
    p.write_bytes(b"")
    r = scan(p)
    assert r["status"] == "ok" and r["data"]["lines_scanned"] == 0
    assert r["summary"] == "%s is empty" % p


def test_non_utf8_and_crlf(tmp_path):
    p = tmp_path / "bin.log"
    p.write_bytes(b"ok\r\n\xff\xfe garbage loss=nan\r\nERROR in step \x80:\r\n")
    r = scan(p)
    assert lines_of(r, "nan-loss") == [2]
    assert r["data"]["matches"]["nan-loss"][0]["text"] == "\ufffd\ufffd garbage loss=nan"
    assert r["data"]["matches"]["empty-error"][0]["text"] == "ERROR in step \ufffd:"


def test_tail_of_a_big_file_keeps_absolute_line_numbers(tmp_path):
    p = tmp_path / "big.log"
    n = 300000
    with open(p, "w") as f:
        for i in range(1, n + 1):
            f.write("step %d ok\n" % i)
        f.write("step %d loss=nan\n" % (n + 1))
    r = scan(p, lines=5)
    d = r["data"]
    assert (d["lines_scanned"], d["first_line"], d["last_line"]) == (5, n - 3, n + 1)
    assert d["window_truncated"] is True and d["line_numbers"] == "absolute"
    assert lines_of(r, "nan-loss") == [n + 1]
    assert r["summary"] == "1 NaN/inf loss line in last 5 lines of %s" % p


def test_relative_line_numbers_past_the_counting_limit(tmp_path, monkeypatch):
    p = tmp_path / "big.log"
    p.write_text("x\n" * 5000 + "Killed\n" + "y\n")
    monkeypatch.setattr(sl, "COUNT_PREFIX_LIMIT", 100)
    monkeypatch.setattr(sl, "_BLOCK", 16)
    r = scan(p, lines=3)
    d = r["data"]
    assert d["line_numbers"] == "relative" and d["first_line"] == 1
    assert lines_of(r, "killed") == [2]
    assert "first at window line 2: Killed" in r["findings"][0]["message"]


def test_max_bytes_bounds_the_read(tmp_path):
    p = tmp_path / "long.log"
    p.write_text("a" * 10000 + "\n" + "b" * 10 + "\n" + "loss=nan\n")
    r = scan(p, lines=100, max_bytes=30)
    assert [m["text"] for m in r["data"]["matches"]["nan-loss"]] == ["loss=nan"]
    assert r["data"]["lines_scanned"] == 2 and r["data"]["first_line"] == 2


def _naive_tail(data: bytes, n: int):
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    if not data:
        lines = []
    first = max(0, len(lines) - n)
    return lines[first:], first + 1


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\n", b"\xff", b"\r\n", b"long line " * 3]),
                     max_size=60).map(b"".join),
       n=st.integers(min_value=1, max_value=12), block=st.integers(min_value=1, max_value=9))
def test_tail_matches_a_naive_split(tmp_path, data, n, block):
    p = tmp_path / "h.log"
    p.write_bytes(data)
    old = sl._BLOCK
    sl._BLOCK = block
    try:
        lines, first, size, start = sl.tail_lines(str(p), n)
    finally:
        sl._BLOCK = old
    want, want_first = _naive_tail(data, n)
    assert lines == want
    assert size == len(data)
    if want:
        assert first == want_first
        assert data[start:].split(b"\n")[0] == want[0]


# --------------------------------------------------------------------------- as a script

def test_script_parses_as_python38_and_stands_alone():
    src = SCRIPT.read_text()
    tree = ast.parse(src, feature_version=(3, 8))
    imported = script_imports(SCRIPT, module_level=True)   # what importing the script needs
    assert "diagnostics" not in imported
    if hasattr(sys, "stdlib_module_names"):
        assert imported <= set(sys.stdlib_module_names) | {"__future__", "_remote"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("diagnostics")


def test_help_runs_standalone():
    p = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                       timeout=30, cwd="/")
    assert p.returncode == 0
    assert "--path" in p.stdout and "--lines" in p.stdout


@pytest.mark.parametrize("name, rc", [("torch_nccl_timeout.log", 2), ("clean_training.log", 0)])
def test_runs_for_real_as_a_script(name, rc):
    p = subprocess.run([sys.executable, str(SCRIPT), "--path", str(LOGS / name), "--lines", "50"],
                       capture_output=True, text=True, timeout=30, cwd="/")
    assert p.returncode == rc, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc) == {"status", "summary", "findings", "data"}
    assert doc["status"] == {0: "ok", 2: "fail"}[rc]


def test_runs_under_python38_when_available():
    from tests.pythons import require_python
    py = require_python("3.8")
    p = subprocess.run([py, str(SCRIPT), "--path", str(LOGS / "extract_empty_errors.log")],
                       capture_output=True, text=True, timeout=30, cwd="/")
    assert p.returncode == 2, p.stderr
    assert json.loads(p.stdout)["data"]["counts"]["empty-error"] == 4


def test_many_logged_tracebacks_stay_linear(tmp_path):
    """vLLM-style logged tracebacks whose clock ticks leave no traceback open for long."""
    p = tmp_path / "many_tb.log"
    with open(p, "w") as f:
        for i in range(1500):
            pre = "(Worker pid=7) ERROR 05-02 10:%02d:%02d [x.py:1] " % (i // 60 % 60, i % 60)
            f.write(pre + "Traceback (most recent call last):\n")
            f.write(pre + '  File "x.py", line 1, in f\n')
            f.write(pre + "ValueError: bad %d\n" % i)
            f.write("(Worker pid=7) INFO 05-02 10:00:00 [x.py:2] next\n")
    r = scan(p, lines=20000)
    assert r["data"]["counts"]["traceback"] == 1500
    tbs = r["data"]["matches"]["traceback"]
    assert (tbs[0]["line"], tbs[0]["exception_line"], tbs[0]["message"]) == (1, 3, "bad 0")
    assert (tbs[-1]["line"], tbs[-1]["message"]) == (5997, "bad 1499")


@pytest.mark.parametrize("line", [
    "loss" * 16384,                    # one 64 KiB word full of "loss"
    "loss " * 13000,
    "loss: " * 10000,
    "loss=" + " " * 65000 + "x",
    "x is " * 12000 + "loss",
    ("lossloss" * 4000) + " loss=nan",
])
def test_hostile_nan_loss_lines_are_classified(tmp_path, line):
    """Lines built to make a backtracking loss pattern quadratic (a word holding "loss" thousands
    of times, long blank runs after a key): classified, and the real one still found. The time
    they take is measured in bench/scan_log_lines.py, not here."""
    p = tmp_path / "hostile.log"
    p.write_text(line + "\n")
    r = scan(p)
    assert lines_of(r, "nan-loss") == ([1] if line.endswith("loss=nan") else [])


def test_scan_log_through_the_real_program():
    """mldiag scan-log on the local target, a recorded Megatron log: the table names the first
    and last NaN loss lines."""
    from tests.programs import mldiag
    r = mldiag("scan-log", "--path", str(LOGS / "megatron_nan_loss.log"), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[:2] == ["local", "fail"], r.stdout
    assert "5 NaN/inf loss lines in all 8 lines of " in lines[1], r.stdout
    assert lines[2].startswith("  fail  nan-loss: 5 NaN/inf loss lines \u2014 first at line 3:"), r.stdout
    # the NaN lies past what the message quotes of the line: the part that matched follows
    assert ("| learning rate: 3.0000 \u2026 loss: NAN; last at line 8: AssertionError: Rank 0: "
            "found NaN in local forward loss calculation.") in lines[2], r.stdout
