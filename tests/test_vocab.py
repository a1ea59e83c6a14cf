"""The vocabulary (commtag.vocab) against the real torch: one table per fact, and it is complete."""

from __future__ import annotations

import torch

from commtag import vocab
from commtag.schema import CollectiveAnnotation


def test_every_torch_dtype_has_one_scalar_type_name_and_its_size() -> None:
    dtypes = {getattr(torch, name) for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)}
    table = {getattr(torch, row.attr): row for row in vocab.DTYPES}
    assert set(table) == dtypes
    assert len({row.scalar_type for row in vocab.DTYPES}) == len(vocab.DTYPES)
    for dtype, row in table.items():
        if row.nbytes is not None:
            assert row.nbytes == dtype.itemsize, row
    assert vocab.SCALAR_TYPE_OF["qint8"] == "QInt8" and vocab.SCALAR_TYPE_BYTES["BFloat16"] == 2


def test_the_annotation_serializes_exactly_the_eager_keys_in_the_profilers_order() -> None:
    annotation = CollectiveAnnotation.model_validate({
        "Collective name": "send", "In msg nelems": 4, "Out msg nelems": 4, "Group size": 2, "dtype": "QInt8",
        "Global rank start": 0, "Global rank stride": 1, "Process Group Name": "0",
        "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]", "Rank": 1, "Dst Rank": 1,
        "Src Rank": 0, "Seq": 1, "commtag lane id": 60, "commtag lane": "PG 0", "commtag pg uid": "0:x",
    })
    eager = [key for key in annotation.eager_dict() if not key.startswith("commtag ")]
    assert tuple(eager) == vocab.EAGER_KEYS
    assert set(vocab.KERNEL_EAGER_KEYS) <= set(vocab.EAGER_KEYS)
