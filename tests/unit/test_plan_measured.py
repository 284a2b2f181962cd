"""`ecotrain plan`'s measured lines: the peak of real steps, its gap to the estimate, and one line
when the plan does not fit or could not be measured (plan.measured_report)."""

from ecotrain.memory.estimate import Plan, measured_report

MiB = 2**20
PLAN = Plan(params=10, param_bytes=10 * MiB, grad_bytes=10 * MiB, optim_bytes=20 * MiB, act_bytes=60 * MiB,
            act_bytes_off=60 * MiB, act_bytes_all=30 * MiB, micro_batch=8, n_checkpointed=0)  # total 100 MiB
H200 = {"gpu_name": "NVIDIA H200", "gpu_total_bytes": 140 * 2**30}


def out(**over):
    return {"peak_bytes": 125 * MiB, "reserved_bytes": 160 * MiB, "device_type": "cuda", "oom_recoveries": 0,
            "micro_batches": 1, **over}


def test_cuda_lines_say_allocated_reserved_device_and_gap():
    lines, failed = measured_report(PLAN, out(), H200, 3)
    text = "\n".join(lines)
    assert failed is None and len(lines) == 3
    assert "125.0 MB" in lines[0] and "max_memory_allocated" in lines[0] and "NVIDIA H200 (140.00 GiB)" in lines[0]
    assert "160.0 MB" in lines[1] and "max_memory_reserved" in lines[1]
    assert "+25.0 MB" in lines[2] and "1.25x" in lines[2] and "peak RSS" not in text
    lines, _ = measured_report(PLAN, out(peak_bytes=80 * MiB), H200, 3)  # under the estimate: no excuse given
    assert "-20.0 MB" in lines[2] and "0.80x)" in lines[2]


def test_cpu_line_is_labelled_peak_rss_of_the_process():
    lines, failed = measured_report(PLAN, out(device_type="cpu", reserved_bytes=None, peak_bytes=400 * MiB), {}, 3)
    assert failed is None and len(lines) == 2
    assert "peak RSS" in lines[0] and "interpreter" in lines[0] and "400.0 MB" in lines[0]
    assert "+300.0 MB" in lines[1] and "4.00x" in lines[1]


def test_does_not_fit_one_line_with_estimate_and_device_total():
    lines, failed = measured_report(PLAN, out(oom_recoveries=1, micro_batches=2), H200, 3)
    assert lines and "\n" not in failed
    assert "2 micro-batches" in failed and "does not fit: estimate 100.0 MB, device total 140.00 GiB" in failed
    lines, failed = measured_report(PLAN, None, H200, 3, "out of memory at step 1 with micro-batch 1 (batch 8 ...)")
    assert lines == [] and "ran out of memory" in failed and "device total 140.00 GiB" in failed
    _, failed = measured_report(PLAN, None, {}, 3, "the run stopped before step 3")
    assert failed == "plan: measuring 3 training steps on cpu failed: the run stopped before step 3"
