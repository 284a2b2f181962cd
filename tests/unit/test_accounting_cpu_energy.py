"""energy.cpu_time_kwh: where no meter measured the energy, the RAM power x wall time term counts only
the share of the wall time the run held a CPU; a run that waited behind other processes is not
charged for the wait. Metered figures and GPU runs pass through."""

from ecotrain.accounting.energy import cpu_time_kwh


def ledger(wall, cpu, method="estimated", device="cpu", threads=1):
    return {"wall_seconds": wall, "cpu_seconds": cpu, "device": {"name": device, "count": threads},
            "energy": {"kwh": 3.0, "method": method, "components_kwh": {"cpu": 1.0, "gpu": 0.0, "ram": 2.0}}}


def test_a_run_that_waited_for_a_core_is_not_charged_ram_power_for_the_wait():
    assert cpu_time_kwh(ledger(10.0, 10.0)) == 3.0  # on a CPU all the time: the figure as it is
    assert cpu_time_kwh(ledger(20.0, 10.0)) == 2.0  # half the wall time waiting: RAM 2 -> 1
    assert cpu_time_kwh(ledger(10.0, 10.0, threads=2)) == 2.0  # 2 threads, one core's worth used


def test_metered_figures_gpu_runs_and_missing_energy_pass_through():
    assert cpu_time_kwh(ledger(20.0, 10.0, method="measured")) == 3.0
    assert cpu_time_kwh(ledger(20.0, 10.0, device="NVIDIA H100")) == 3.0
    assert cpu_time_kwh({"energy": {"kwh": None}}) is None
