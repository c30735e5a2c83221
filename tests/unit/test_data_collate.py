"""The DataModule collate: PIL images stay in lists, skipped images are dropped and listed, empty batches survive."""

from __future__ import annotations

from PIL import Image

from qkvqa.data_modules.base import SAMPLE_KEYS, collate_samples


def _sample(data_id: str, image) -> dict:
    sample = {key: None for key in SAMPLE_KEYS}
    skip = (
        None
        if image is not None
        else {"image_id": f"img-{data_id}", "dataset_name": "infoseek", "reason": "missing", "path": None, "detail": ""}
    )
    sample.update(data_id=data_id, question=f"q {data_id}", image=image, image_skip=skip)
    return sample


def test_images_stay_pil_and_samples_without_image_are_dropped_and_listed():
    red = Image.new("RGB", (4, 4), (255, 0, 0))
    batch = collate_samples([_sample("a", red), _sample("b", None), _sample("c", red)])
    assert batch["size"] == 2
    assert batch["data_id"] == ["a", "c"] and batch["question"] == ["q a", "q c"]
    assert all(isinstance(image, Image.Image) for image in batch["image"])
    assert batch["dropped_data_ids"] == ["b"]
    assert [s["image_id"] for s in batch["skipped_images"]] == ["img-b"]


def test_an_all_skipped_batch_is_an_empty_batch():
    batch = collate_samples([_sample("a", None), _sample("b", None)])
    assert batch["size"] == 0
    assert batch["data_id"] == [] and batch["image"] == []
    assert batch["dropped_data_ids"] == ["a", "b"] and len(batch["skipped_images"]) == 2


def test_samples_without_image_can_be_kept():
    batch = collate_samples([_sample("a", None)], drop_missing_images=False)
    assert batch["size"] == 1 and batch["image"] == [None]
    assert batch["dropped_data_ids"] == [] and len(batch["skipped_images"]) == 1
