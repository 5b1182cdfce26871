"""The data pipeline under PyTorch's name for it (torch.utils.data): see tritonad.data."""
from ..data import (ConcatDataset, DataLoader, Dataset, IterableDataset, Subset,  # noqa: F401
                    TensorDataset, default_collate, random_split)

__all__ = ["ConcatDataset", "DataLoader", "Dataset", "IterableDataset", "Subset",
           "TensorDataset", "default_collate", "random_split"]
