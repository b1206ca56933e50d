"""The one measurement core: every front end times kernels through `measure()`.

Importing this package does not import torch or pynvml; they are loaded when a GPU is measured.
"""

from dskbench.measure.calibrate import calibrate_launch_gap, settings_with_gap
from dskbench.measure.ceilings import measure_ceilings
from dskbench.measure.core import measure
from dskbench.measure.metrics import metrics
from dskbench.measure.nvml import gpu_identity, read_clocks
from dskbench.measure.peaks import datasheet_peaks
from dskbench.measure.sampling import CaptureFailed
from dskbench.measure.settings import Measurement, MeasureSettings

__all__ = [
    "CaptureFailed",
    "MeasureSettings",
    "Measurement",
    "calibrate_launch_gap",
    "datasheet_peaks",
    "gpu_identity",
    "measure",
    "measure_ceilings",
    "metrics",
    "read_clocks",
    "settings_with_gap",
]
