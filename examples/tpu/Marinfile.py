"""A TPU step: run train.py on every host of one v4-32 slice (4 hosts).

    marinbuild run train --cluster cluster.toml
"""

from marinbuild import ResourceConfig, step

train = step("train", cmd="python train.py", resources=ResourceConfig.with_tpu("v4-32"))
