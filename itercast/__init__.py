"""itercast: forecast distributed deep-learning training before paying for the GPUs.

Public entry points::

    from itercast import Job, predict
    job = Job.from_presets(model="gpt3-175b", system="dgx-a100", num_nodes=128,
                           plan={"tensor_parallel": 8, "pipeline_parallel": 8, ...})
    result = predict(job)
"""

from __future__ import annotations

from itercast.config.job import Job
from itercast.errors import ConfigError
from itercast.predict import Prediction, predict

__all__ = ["ConfigError", "Job", "Prediction", "predict"]
__version__ = "0.1.0"
