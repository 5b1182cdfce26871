"""`tritonad.utils.data`: where PyTorch scripts look for DataLoader and Dataset
(`torch.utils.data.DataLoader`); the same objects as tritonad.data."""
from . import data  # noqa: F401
