"""Image resolvers per layout, the counting ImageLoader (missing / corrupt), and OMGM article images with fallback."""

from __future__ import annotations

import csv
import json

import pytest

from qkvqa.data.config import ImagesConfig
from qkvqa.data.images import ArticleImageIndex, ImageLoader, QueryImageResolver, url_store_path
from qkvqa.errors import ConfigError
from tests.data_fixtures import write_image


def test_inaturalist_id2name_maps_are_merged_and_flat_layout_uses_the_id(tmp_path):
    (tmp_path / "train_id2name.json").write_text(json.dumps({"11": "train/birds/a.jpg"}))
    (tmp_path / "val_id2name.json").write_text(json.dumps({"22": "val/birds/b.jpg"}))
    config = ImagesConfig(
        inaturalist_root="inat",
        inaturalist_id2name="train_id2name.json",
        inaturalist_id2name_extra=["val_id2name.json"],
    )
    resolver = QueryImageResolver(config, root=tmp_path)
    write_image(tmp_path / "inat/val/birds/b.jpg")
    assert resolver.resolve("inaturalist", "22") == tmp_path / "inat/val/birds/b.jpg"
    assert resolver.candidates("inaturalist", "11") == [tmp_path / "inat/train/birds/a.jpg"]
    assert resolver.candidates("inaturalist", "33") == []
    flat = QueryImageResolver(ImagesConfig(inaturalist_root=str(tmp_path / "flat"), inaturalist_layout="flat"))
    write_image(tmp_path / "flat/11.jpg")
    assert flat.resolve("inaturalist", "11") == tmp_path / "flat/11.jpg"


def test_landmarks_use_the_abc_sharded_layout(tmp_path):
    resolver = QueryImageResolver(ImagesConfig(landmarks_root=str(tmp_path)))
    write_image(tmp_path / "f/0/a/f0a1b2c3d4e5f607.jpg")
    assert resolver.resolve("landmarks", "f0a1b2c3d4e5f607") == tmp_path / "f/0/a/f0a1b2c3d4e5f607.jpg"
    loader = ImageLoader(resolver)
    assert loader.load("landmarks", "f0") is None
    assert loader.skipped[("landmarks", "f0")].reason == "missing"


def test_infoseek_tries_jpg_then_jpeg(tmp_path):
    resolver = QueryImageResolver(ImagesConfig(infoseek_root=str(tmp_path)))
    write_image(tmp_path / "oven_1.JPEG")
    assert resolver.resolve("infoseek", "oven_1") == tmp_path / "oven_1.JPEG"
    write_image(tmp_path / "oven_1.jpg")
    assert resolver.resolve("infoseek", "oven_1") == tmp_path / "oven_1.jpg"


def test_unset_roots_and_unknown_layouts_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="landmarks_root is not set"):
        QueryImageResolver(ImagesConfig()).candidates("landmarks", "abc123")
    with pytest.raises(ConfigError, match="landmarks_layout"):
        QueryImageResolver(ImagesConfig(landmarks_layout="id2name"))


def test_loader_returns_rgb_and_counts_missing_and_corrupt_images_once_each(tmp_path):
    write_image(tmp_path / "ok.png", image_format="PNG")
    (tmp_path / "bad.jpg").write_bytes(write_image(tmp_path / "full.jpg").read_bytes()[:60])
    (tmp_path / "text.jpg").write_text("not an image")
    loader = ImageLoader(QueryImageResolver(ImagesConfig(infoseek_root=str(tmp_path), extensions=[".jpg", ".png"])))
    image = loader.load("infoseek", "ok")
    assert image.mode == "RGB" and image.size == (16, 16)
    assert loader.load("infoseek", "bad") is None
    assert loader.load("infoseek", "text") is None
    assert loader.load("infoseek", "gone") is None
    assert loader.load("infoseek", "gone") is None
    assert loader.counts() == {"missing": 1, "corrupt": 2, "too_small": 0, "outside_root": 0}
    assert loader.skipped[("infoseek", "gone")].path == str(tmp_path / "gone.jpg")


def test_skipped_ids_are_written_to_the_run_directory(tmp_path):
    loader = ImageLoader(QueryImageResolver(ImagesConfig(infoseek_root=str(tmp_path))))
    loader.load("infoseek", "oven_05001795")
    path = loader.write_skipped(tmp_path / "run")
    record = json.loads(path.read_text())
    assert path.name == "skipped_images.json"
    assert record["counts"] == {"missing": 1, "corrupt": 0, "too_small": 0, "outside_root": 0}
    assert [s["image_id"] for s in record["skipped"]] == ["oven_05001795"]


def _write_title_csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["title", "image_URL", "img_path", "caption"])
        writer.writerows(rows)
    return path


def test_article_images_keep_at_most_n_existing_files_per_title_in_csv_order(tmp_path):
    rows = [
        ["Kestrel", f"https://x/{i}.jpg", f"full/wiki_image_split/wiki_entity_image_1/k{i}.jpg", f"cap {i}"]
        for i in range(14)
    ]
    for i in range(14):
        if i != 0:
            write_image(tmp_path / f"full/wiki_image_split/wiki_entity_image_1/k{i}.jpg")
    rows.append(["Ørsted moth", "https://x/o.jpg", "full/wiki_image_split/wiki_entity_image_2/o.png", "moth"])
    write_image(tmp_path / "full/wiki_image_split/wiki_entity_image_2/o.png", image_format="PNG")
    _write_title_csv(tmp_path / "wiki_image_url_part_1_processed.csv", rows[:8])
    _write_title_csv(tmp_path / "wiki_image_url_part_2_processed.csv", rows[8:])
    # img_path is relative to the folder holding full/ (OMGM's wiki_img_path_prefix), here tmp_path itself
    config = ImagesConfig(kb_image_csvs=["wiki_image_url_part_*_processed.csv"], kb_image_root=".")
    index = ArticleImageIndex.from_config(config, root=tmp_path)
    kept = index.images("Kestrel")
    assert [img.caption for img in kept] == [f"cap {i}" for i in range(1, 11)]
    assert index.main_image("Kestrel") == kept[0].path
    assert index.main_image("Ørsted moth").suffix == ".png"


def test_main_image_falls_back_to_the_url_store_and_counts_articles_without_one(tmp_path):
    url = "https://upload.wikimedia.org/wikipedia/commons/a/ab/Zürich%20Tower.jpg"
    store = tmp_path / "url_store"
    assert url_store_path(store, url) == store / "upload.wikimedia.org/wikipedia/commons/a/ab/Zürich Tower.jpg"
    write_image(url_store_path(store, url))
    index = ArticleImageIndex({}, url_store=store)
    assert index.main_image("Zürich Tower", [url]) == url_store_path(store, url)
    assert index.main_image("Bare", []) is None
    assert index.main_image("Gone", ["https://upload.wikimedia.org/x.jpg"]) is None
    assert index.coverage() == {
        "titles_with_csv_images": 0,
        "fallback_to_url_store": 1,
        "titles_without_image": 2,
        "unreadable_images": 0,
    }


def test_a_missing_image_folder_is_refused_before_any_work(tmp_path):
    from types import SimpleNamespace

    from qkvqa.data.config import ImagesConfig
    from qkvqa.data.images import QueryImageResolver
    from qkvqa.errors import DataError

    (tmp_path / "inat").mkdir()
    resolver = QueryImageResolver(ImagesConfig(inaturalist_root="inat", landmarks_root="landmarks_typo"), tmp_path)
    inat = SimpleNamespace(dataset_name="inaturalist", image_id="123")
    resolver.check_roots([inat])
    with pytest.raises(DataError) as error:
        resolver.check_roots([inat, SimpleNamespace(dataset_name="landmarks", image_id="abc123")])
    assert "landmarks_typo" in str(error.value) and "'abc123'" in str(error.value)


def test_a_tiny_query_image_is_a_counted_skip_of_that_question_only(tmp_path):
    from PIL import Image

    from qkvqa.data.config import ImagesConfig
    from qkvqa.data.images import ImageLoader, QueryImageResolver

    (tmp_path / "q").mkdir()
    Image.new("RGB", (1, 1), "red").save(tmp_path / "q" / "dot.jpg")
    Image.new("RGB", (40, 3), "red").save(tmp_path / "q" / "strip.jpg")
    Image.new("RGB", (40, 30), "red").save(tmp_path / "q" / "fine.jpg")
    loader = ImageLoader(QueryImageResolver(ImagesConfig(infoseek_root="q"), tmp_path))
    assert loader.load("infoseek", "dot") is None and loader.load("infoseek", "strip") is None
    assert loader.load("infoseek", "fine").size == (40, 30)
    assert loader.counts() == {"missing": 0, "corrupt": 0, "too_small": 2, "outside_root": 0}


def test_more_missing_images_than_the_bound_stop_the_run_before_any_work(tmp_path):
    """Issue 14 item 3: 10 of 18 images missing scored R@10 = 100 over the 8 found; now a run above the bound stops."""
    from types import SimpleNamespace

    from qkvqa.errors import DataError

    (tmp_path / "imgs").mkdir()
    questions = [SimpleNamespace(dataset_name="infoseek", image_id=f"oven_{i}") for i in range(20)]
    for q in questions[2:]:
        write_image(tmp_path / "imgs" / f"{q.image_id}.jpg")
    config = ImagesConfig(infoseek_root="imgs", max_missing_fraction=0.1)
    counts = QueryImageResolver(config, tmp_path).check_images(questions, "test")
    assert counts == {"questions": 20, "missing": 2, "max_missing_fraction": 0.1}
    (tmp_path / "imgs" / "oven_5.jpg").unlink()
    with pytest.raises(DataError, match=r"3 of 20 test query images are missing \(15\.0%.*e\.g\. oven_0 \("):
        QueryImageResolver(config, tmp_path).check_images(questions, "test")
