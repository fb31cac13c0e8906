"""ddpbench_record: ddpbench's measurements for a user's own torchrun PyTorch DDP script.

    import ddpbench_record
    rec = ddpbench_record.Recorder(ddp_model, optimizer, out="results/myjob", batch_size=64, model_name="my-vit")
    for batch in rec.batches(loader):
        ...  # forward, loss, backward, optimizer.step() as the script writes them
    rec.close()

then `ddpbench reduce results/myjob` (docs/your-pytorch-job.md)."""

__version__ = "0.1.0"

from .columns import COLUMNS, PHASES  # noqa: E402
from .recorder import Recorder, RecorderError  # noqa: E402

__all__ = ["Recorder", "RecorderError", "COLUMNS", "PHASES", "__version__"]
