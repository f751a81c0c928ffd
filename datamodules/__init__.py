"""Data: LongVideo-Reason rows in WebDataset shards, video decoding, the synthetic task, the DataModule."""
