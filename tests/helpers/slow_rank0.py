"""Run under torchrun: `ecotrain fit` whose rank 0 is slow in its own work (a slow disk), each
write of rank 0 alone taking SLOW seconds: the checkpoint, the final weights, the trackers' upload.

    torchrun ... tests/helpers/slow_rank0.py SLOW fit RECIPE --run-dir D ...
"""

import os
import sys
import time

import ecotrain.checkpoint.manager as manager
import ecotrain.assembly.finish as finish
from ecotrain.cli import main

slow = float(sys.argv[1])


def slowly(fn):
    def wrapped(*args, **kwargs):
        if os.environ.get("RANK") == "0":
            time.sleep(slow)
        return fn(*args, **kwargs)
    return wrapped


manager.write_checkpoint = slowly(manager.write_checkpoint)  # the synchronous DDP write
finish.save_weights = slowly(finish.save_weights)  # then every rank evaluates, with collectives
finish.after_finish = slowly(finish.after_finish)  # then every rank ends (dist.shutdown)
sys.exit(main(sys.argv[2:]))
