"""Data at run time: LongVideo-Reason rows in WebDataset shards, video decoding, the DataModule.

Building shards is offline work in :mod:`datatools`, which this package never imports.
"""
