"""Driver for test_subprocess_ray: a controller interrupted (SIGINT) while a worker call runs.

Run as a script (its own Ray): `python interrupt_driver.py TEMP_DIR`. Prints JSON lines on stdout:
first {"pids": [...]} of the workers, then blocks in a 60 s worker call. On Ctrl-C, while Ray is
still up, it prints what cleanup left behind ({"interrupted": ...}) and re-raises the
KeyboardInterrupt, so the process ends as an interrupted Python program does.
"""

import json
import signal
import sys

import ray
import toy_workers  # beside this script (sys.path[0])

from tandem.controller import ResourcePool, WorkerGroup, init_ray


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(temp_dir: str) -> None:
    # started as a background job by a non-interactive shell, a process begins with SIGINT ignored:
    # behave as a program run in a terminal, where Ctrl-C raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    init_ray(num_cpus=2, _temp_dir=temp_dir, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(toy_workers)  # the actors cannot import it
    pool = ResourcePool(nnodes=1, workers_per_node=2, cpus_per_worker=1, name="interrupted")
    group = WorkerGroup.ray(toy_workers.ToyWorker, pool, name="sleepers")
    pids = [info["pid"] for info in group.info()]
    say(pids=pids)
    try:
        group.sleep(60)
    except KeyboardInterrupt:
        # Ray is still up here: whatever is gone was released by the SIGINT handler, not ray.shutdown()
        say(
            interrupted=True,
            group=repr(group),
            pool_removed=pool.removed,
            workers_alive=toy_workers.pids_still_there(pids, timeout_s=15.0),
        )
        raise
    say(interrupted=False)


if __name__ == "__main__":
    main(sys.argv[1])
