"""Driver for test_subprocess_ray: a 2-node Ray cluster on this machine, one rank per node.

Run as a script (its own Ray, not the test session's): `python cluster_driver.py TEMP_DIR`.
Prints one JSON line: the cluster's node ids and what each rank reports about where it runs.
"""

import json
import sys
from pathlib import Path

import ray
import toy_workers  # beside this script (sys.path[0])
from ray.cluster_utils import Cluster

from tandem.controller import ResourcePool, WorkerGroup, init_ray


class NodeReporter(toy_workers.ToyWorker):
    def where(self) -> dict:
        return {
            "rank": self.ctx.rank,
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_rank": self.ctx.node_rank,
            "local_rank": self.ctx.local_rank,
        }


def main(temp_dir: str) -> None:
    # 1 CPU per node: each node's placement group of one 1-CPU bundle fits on one node only
    node_args = {"num_cpus": 1, "temp_dir": temp_dir, "object_store_memory": 80 * 1024**2}
    # ray's Cluster writes the head's address to /tmp/ray whatever temp_dir says; it does not create it.
    Path(ray._private.utils.get_ray_address_file(None)).parent.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    try:
        second = cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        init_ray(address=cluster.address, log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(toy_workers)  # the actors cannot import it
        pool = ResourcePool(nnodes=2, workers_per_node=1, cpus_per_worker=1, name="two-nodes")
        group = WorkerGroup.ray(NodeReporter, pool, name="spread")
        report = {
            "head_node_id": cluster.head_node.node_id,
            "second_node_id": second.node_id,
            "ranks": group.where(),
            "all_reduce": group.rank_sum(),
        }
        group.shutdown()
        pool.remove()
        ray.shutdown()
    finally:
        cluster.shutdown()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
