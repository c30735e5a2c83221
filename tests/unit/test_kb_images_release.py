"""KB article images as OMGM releases them (issue 30 item 2, issue 31 item 2 for the CSVs' img_path).

OMGM (ChaoLinAViy/OMGM) lays its wiki images out as `output/wiki_image_url_part_N_processed.csv` beside
`full/wiki_image_split/wiki_entity_image_N/` (README.md, "Wiki Images"); each CSV row's `img_path` reads
`full/wiki_image_split/wiki_entity_image_{num}/image` (utils/utils.py:77) and is joined to
`wiki_img_path_prefix`, "the parent folder containing the full/wiki_image_split folder" (README.md,
`--wiki_img_path_prefix`; utils/utils.py:101 `os.path.join(wiki_img_path_prefix, img_path)`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from qkvqa.data.config import ImagesConfig, data_config_from_dict
from qkvqa.data.images import ArticleImageIndex
from qkvqa.errors import DataError
from tests.data_fixtures import write_image

REPO = Path(__file__).resolve().parents[2]
RELEASE_PRESETS = ("evqa_data", "infoseek_data", "infoseek_reflectiva_data")
TITLES = [f"Entity {i}" for i in range(16)]


def _release(root: Path, titles=TITLES, write_files: bool = True) -> Path:
    """OMGM's wiki-image folder under `root/wiki_image`: two CSVs in output/, their images in full/."""
    folder = root / "wiki_image"
    for part in (1, 2):
        rows = [["title", "image_URL", "img_path", "caption"]]
        for title in titles[part - 1 :: 2]:
            name = title.replace(" ", "_") + ".jpg"
            img_path = f"full/wiki_image_split/wiki_entity_image_{part}/{name}"
            rows.append([title, f"https://upload.wikimedia.org/x/{name}", img_path, f"Photo of {title}"])
            if write_files:
                write_image(folder / img_path)
        (folder / "output").mkdir(parents=True, exist_ok=True)
        with open(
            folder / "output" / f"wiki_image_url_part_{part}_processed.csv", "w", newline="", encoding="utf-8"
        ) as f:
            csv.writer(f).writerows(rows)
    return folder


def _preset_images(name: str) -> dict:
    return yaml.safe_load((REPO / "experiments/presets" / f"{name}.yaml").read_text(encoding="utf-8"))["data"]["images"]


@pytest.mark.parametrize("preset", RELEASE_PRESETS)
def test_each_release_preset_finds_omgm_images_where_omgm_puts_them(preset, tmp_path):
    _release(tmp_path)
    images = _preset_images(preset)
    config = ImagesConfig(kb_image_csvs=images["kb_image_csvs"], kb_image_root=images["kb_image_root"])
    index = ArticleImageIndex.from_config(config, root=tmp_path)
    assert sorted(index.by_title) == sorted(TITLES)
    main = index.main_image("Entity 3")
    assert main == tmp_path / "wiki_image/full/wiki_image_split/wiki_entity_image_2/Entity_3.jpg" and main.is_file()
    assert index.missing_counts(TITLES) == {"tried": 16, "missing": 0, "titles_with_images": 16}


def _datamodule(tmp_path: Path, kb_image_root: str, bound: float = 0.02, titles=TITLES):
    """An E-VQA DataModule over a KB store of `titles` with OMGM's CSVs (kb_image_root as given)."""
    import json

    from qkvqa.data.kb import build_kb_store
    from qkvqa.data_modules import build_data_module

    kb = {
        f"https://en.wikipedia.org/wiki/{t.replace(' ', '_')}": {
            "title": t,
            "section_titles": [t],
            "section_texts": [f"{t} is a thing."],
            "image_urls": [],
            "image_reference_descriptions": [],
            "image_section_indices": [],
            "url": "",
        }
        for t in titles
    }
    for url, entry in kb.items():
        entry["url"] = url
    (tmp_path / "encyclopedic_kb_wiki.json").write_text(json.dumps(kb), encoding="utf-8")
    if not (tmp_path / "kb_store").exists():
        build_kb_store(tmp_path / "encyclopedic_kb_wiki.json", tmp_path / "kb_store")
    return build_data_module(
        data_config_from_dict(
            {
                "dataset": "evqa",
                "root": str(tmp_path),
                "kb_source": "encyclopedic_kb_wiki.json",
                "kb_store": "kb_store",
                "images": {
                    "kb_image_csvs": ["wiki_image/output/wiki_image_url_part_*_processed.csv"],
                    "kb_image_root": kb_image_root,
                    "max_missing_fraction": bound,
                },
            }
        )
    )


def test_a_kb_image_root_one_folder_off_stops_with_the_counts_and_the_paths_tried(tmp_path):
    """The old presets' `wiki_image/full` looked every file up under wiki_image/full/full/... and went on with none."""
    _release(tmp_path)
    with pytest.raises(DataError) as error:
        _datamodule(tmp_path, "wiki_image/full").article_images()
    message = str(error.value)
    assert "16 of 16 KB images" in message and "max_missing_fraction=0.02" in message
    assert str(tmp_path / "wiki_image/full/full/wiki_image_split/wiki_entity_image_1/Entity_0.jpg") in message
    assert f"exists under {tmp_path / 'wiki_image'}: kb_image_root should be that folder" in message
    assert "\n" not in message
    assert _datamodule(tmp_path, "wiki_image").article_images().main_image("Entity 0").is_file()


def test_missing_kb_images_under_the_bound_are_counted_above_it_stop(tmp_path):
    folder = _release(tmp_path)
    (folder / "full/wiki_image_split/wiki_entity_image_1/Entity_0.jpg").unlink()  # 1 of 16: 6 %
    index = _datamodule(tmp_path, "wiki_image", bound=0.1).article_images()
    assert index.missing_counts(TITLES) == {"tried": 16, "missing": 1, "titles_with_images": 15}
    with pytest.raises(
        DataError, match=r"1 of 16 KB images .* \(6\.2%, more than data.images.max_missing_fraction=0.05"
    ):
        _datamodule(tmp_path, "wiki_image", bound=0.05).article_images()


def test_only_the_kb_articles_images_count_and_a_kb_without_any_image_stops(tmp_path):
    """Images the CSVs list for titles the KB lacks are not this run's; a KB none of whose titles has an image
    (another KB's CSVs) would make the QFF score every article 0, in silence."""
    _release(tmp_path, titles=TITLES + [f"Other {i}" for i in range(40)], write_files=False)
    for title in TITLES:
        part = 1 + TITLES.index(title) % 2
        write_image(
            tmp_path / f"wiki_image/full/wiki_image_split/wiki_entity_image_{part}/{title.replace(' ', '_')}.jpg"
        )
    index = _datamodule(tmp_path, "wiki_image").article_images()  # 40 of 56 listed files missing
    assert len(index.by_title) == 16 and index.missing_counts()["missing"] == 40
    other = tmp_path / "other"
    other.mkdir()
    _release(other, titles=[f"Other {i}" for i in range(4)])
    with pytest.raises(DataError, match=r"none of the 16 articles of the KB store's articles has an image"):
        _datamodule(other, "wiki_image", bound=1.0).article_images()


def test_an_img_path_that_leaves_its_root_is_never_read_and_counts_as_missing(tmp_path):
    """Issue 31 item 2: an absolute img_path, `..` or a symlink out of kb_image_root once read the outside file."""
    folder = _release(tmp_path)
    secret = write_image(tmp_path / "private" / "secret.jpg")
    (folder / "full/wiki_image_split/link").symlink_to(tmp_path / "private")
    hostile = [
        ["Entity 0", "https://x/a.jpg", str(secret), "absolute"],
        ["Entity 1", "https://x/b.jpg", "full/../../private/secret.jpg", "dot-dot"],
        ["Entity 2", "https://x/c.jpg", "full/wiki_image_split/link/secret.jpg", "symlinked folder"],
    ]
    (folder / "full/wiki_image_split/wiki_entity_image_1/out.jpg").symlink_to(secret)
    hostile.append(["Entity 4", "https://x/d.jpg", "full/wiki_image_split/wiki_entity_image_1/out.jpg", "symlink"])
    with open(folder / "output/wiki_image_url_part_3_processed.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["title", "image_URL", "img_path", "caption"], *hostile])
    config = ImagesConfig(
        kb_image_csvs=["wiki_image/output/wiki_image_url_part_3_processed.csv"], kb_image_root="wiki_image"
    )
    index = ArticleImageIndex.from_config(config, root=tmp_path)
    assert index.by_title == {} and index.outside_root == 4
    assert all(reason == "outside_root" for _, _, reason in index.missing_examples)
    with pytest.raises(DataError, match=r"4 of 4 KB images .*\(outside the image root\)"):
        index.check_missing(0.02)


def test_a_url_store_path_that_leaves_the_store_is_never_read(tmp_path):
    secret = write_image(tmp_path / "secret.jpg")
    store = tmp_path / "store"
    store.mkdir()
    index = ArticleImageIndex({}, url_store=store)
    assert index.main_image("Sneaky", ["https://host/../../secret.jpg"]) is None
    assert secret.is_file() and index.coverage()["titles_without_image"] == 1


def test_mining_that_keeps_no_sample_stops_and_writes_no_pools(tmp_path):
    """Every gold article without its image (a wrong kb_image_root) once dropped every sample as no_gold_image and
    wrote empty pools, exit 0."""
    from qkvqa.data.questions import Question
    from qkvqa.qff.mining import ArticleFactsSource, ImagePaths, check_kept, mine_pools
    from qkvqa.retrieval.results import Retrieved

    store = _datamodule(tmp_path, "wiki_image").kb_store()
    facts = ArticleFactsSource(store, ArticleImageIndex({}), ImagePaths(tmp_path / "wiki_image", tmp_path))
    urls = [f"https://en.wikipedia.org/wiki/Entity_{i}" for i in range(16)]
    questions = [
        Question(
            data_id=f"q{i}",
            question="what?",
            answers=["x"],
            raw_answer="x",
            question_type="templated",
            image_id=f"img{i}",
            image_ids=[f"img{i}"],
            dataset_name="landmarks",
            gold_urls=[urls[i]],
            gold_title=f"Entity {i}",
            evidence_section_id=0,
            evidence_section_title="",
            split="train",
            source="test",
        )
        for i in range(4)
    ]
    results = {q.data_id: Retrieved(urls, [None] * 16, [1.0] * 16) for q in questions}
    mined = mine_pools(questions, results, facts, lambda q: q.image_id, split="train")
    assert mined.report["kept"] == 0 and mined.report["dropped_by_reason"]["no_gold_image"] == 4
    with pytest.raises(
        DataError,
        match=r"mining train kept 0 of 4 samples \(dropped: no_gold_image 4\).*"
        r"kb_image_root \(the folder holding full/\)",
    ):
        check_kept(mined.report, tmp_path / "mining_report_train.json")


@pytest.mark.slow
def test_embedding_kb_images_stops_before_the_encoder_and_never_ends_with_0_vectors(world, tmp_path):
    """`embed` once logged "16 images skipped" at INFO and exited 0 with 0 vectors."""
    from omegaconf import OmegaConf

    from qkvqa.config.load import compose
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.retrieval.embed import embed_set

    data = yaml.safe_load((Path(world["dir"]) / "data_evqa.yaml").read_text(encoding="utf-8"))
    tiny = {"kind": "evaclip_hf", "tiny": True, "device": "cpu", "dtype": "fp32"}
    (tmp_path / "empty").mkdir()
    data["images"]["kb_image_root"] = str(tmp_path / "empty")  # every CSV file missing
    cfg = OmegaConf.merge(
        compose(),
        {
            "data": data,
            "components": {"image_encoder": tiny, "text_encoder": tiny},
            "paths": {"cache_dir": str(tmp_path / "cache")},
            "retrieval": {"shard_size": 1000},
        },
    )

    class NoEncoder:  # the check must come before any pixel is encoded
        identity = None

        def __getattr__(self, name):
            raise AssertionError(f"the encoder was used ({name})")

    with pytest.raises(
        DataError,
        match=r"KB images that the title -> image CSVs list for the KB store's articles are "
        r"missing .*tried .*empty/",
    ):
        embed_set(cfg, "kb_images", benchmark=build_benchmark(cfg.data), encoder=NoEncoder())
    cfg.data.images.max_missing_fraction = 1.0
    cfg.data.images.kb_image_url_store = str(tmp_path / "empty")  # no fallback pixels either
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QKVQA_TINY_DIR", str(tmp_path / "tiny"))
        with pytest.raises(DataError, match=r"is complete but holds 0 vectors .*missing_images"):
            embed_set(cfg, "kb_images", benchmark=build_benchmark(cfg.data))


def _qff_datamodule(world: dict, tmp_path: Path, *overrides: str):
    from qkvqa.config.load import compose
    from qkvqa.data_modules.qff_train import QFFTrainDataModule, settings_from_config
    from qkvqa.qff.builder import build_qff_component
    from tests.helpers.qff_study import mine_world

    mined = mine_world(world, tmp_path, splits=("train",))
    cfg = compose("demo/qff_per_layer", [], [*mined, "qff.val_negatives=null", "data.val_questions=null", *overrides])
    component = build_qff_component(cfg.components.qformer, cfg.qff)
    return QFFTrainDataModule(
        cfg.data, settings_from_config(cfg, component), component.tokenizer, component.image_processor
    ), tmp_path / "pools/hardneg_train.json"


@pytest.mark.slow
def test_qff_training_stops_before_fit_on_0_kept_samples_and_on_missing_article_images(world, tmp_path):
    dm, pools = _qff_datamodule(world, tmp_path / "a")
    sidecar = pools.with_name("hardneg_train.articles.json")
    facts = json.loads(sidecar.read_text())
    images = {url: f["image"] for url, f in facts["articles"].items() if f["image"]}
    for f in facts["articles"].values():
        f["image"] = None  # pools mined when no article had its image
    sidecar.write_text(json.dumps(facts))
    with pytest.raises(DataError, match=r"QFF train: 0 of \d+ questions give a training sample .*no_gold_image"):
        dm.setup("fit")
    for url, f in facts["articles"].items():  # the images are back, but the root moved
        f["image"] = images.get(url)
    sidecar.write_text(json.dumps(facts))
    (tmp_path / "empty").mkdir()
    moved, _ = _qff_datamodule(
        world, tmp_path / "b", f"data.images.kb_image_root={tmp_path / 'empty'}", f"qff.negatives={pools}"
    )
    with pytest.raises(DataError, match=r"of the \d+ article images the QFF samples use are missing .*tried "):
        moved.setup("fit")


def test_a_repeated_row_of_a_title_takes_no_second_slot(tmp_path):
    """OMGM keeps at most 10 images per title and skips a repeated {caption, img_path} (utils/utils.py:103)."""
    folder = _release(tmp_path, titles=["Entity 0"])
    rows = [["title", "image_URL", "img_path", "caption"]]
    for i in range(12):
        write_image(folder / f"full/wiki_image_split/wiki_entity_image_1/p{i}.jpg")
        row = ["Entity 0", f"https://x/{i}.jpg", f"full/wiki_image_split/wiki_entity_image_1/p{i}.jpg", f"c{i}"]
        rows += [row, row] if i == 0 else [row]
    with open(folder / "output/wiki_image_url_part_1_processed.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    index = ArticleImageIndex.from_config(
        ImagesConfig(kb_image_csvs=["wiki_image/output/*_part_1_*.csv"], kb_image_root="wiki_image"), root=tmp_path
    )
    assert [i.caption for i in index.images("Entity 0")] == [f"c{i}" for i in range(10)]
