"""Synthetic KB-VQA world: a deterministic mini E-VQA / InfoSeek release, written in exactly the real file formats.

Layout of a world directory (all paths in `world.json` are relative to it):

    world.json                               manifest: seed, counts, paths, every question and image
    data_evqa.yaml, data_infoseek.yaml       DataConfig sections pointing at the files below
    kb/encyclopedic_kb_wiki.json             KB as one JSON dict {url: entry}
    kb/encyclopedic_kb_wiki.jsonl            the same KB, one {url: entry} per line
    kb/store/                                the KB store (`qkvqa kb build`) of the JSON dict
    evqa/                                    the E-VQA release as preset evqa_data reads it (its data.root):
    evqa/{train,val,test}.csv                E-VQA question CSVs (all four question types)
    evqa/encyclopedic_kb_wiki.json, kb_store/  the KB and its store
    evqa/images/inaturalist/{train,val}/{NNNNN_category}/{uuid}.jpg   iNaturalist 2021 images
    evqa/images/inaturalist/{train,val}_id2name.json   EchoSight's id -> path maps, beside the images
    evqa/images/landmarks/a/b/c/{id}.jpg     GLDv2 images (sharded layout)
    infoseek/infoseek_val.jsonl              official reference file (answer_eval, data_split)
    infoseek/infoseek_val_qtype.jsonl        String / Numerical / Time
    infoseek/infoseek_{train,test}_filtered.csv  EchoSight-style CSVs (E-VQA columns + data_id)
    infoseek/images/{val,train}/{id}.jpg|.JPEG   InfoSeek images
    infoseek/wiki_100_dict_v4.json, kb_store/    EchoSight's InfoSeek KB (the world's KB) and its store
    {evqa,infoseek}/wiki_image/output/wiki_image_url_part_{k}_processed.csv   OMGM title -> image CSVs
    {evqa,infoseek}/wiki_image/full/wiki_image_split/wiki_entity_image_{k}/    their images (img_path full/...)
    {evqa,infoseek}/kb_image_url_store/{host}/{path}   local pixels of some KB image_urls (the fallback)

Each fact sits in one sentence of one section, among distractor sentences; questions share words
with that sentence. Many query images show 2-3 entities of different categories, so only the
question tells which one is meant. A few query images are deliberately missing or corrupt; they are
listed under `deliberate_skips` in world.json. Three switches of `generate_world` (and `qkvqa synth`)
make harder worlds: several facts per generic section, multi-entity images of one category, and facts bound to
the surveys that report them.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from qkvqa.errors import DataError
from qkvqa.synth.render import PALETTE, PATTERNS, Signature, encode, render
from qkvqa.utils.io import atomic_write_json, atomic_write_text
from qkvqa.utils.logging import get_logger
from qkvqa.utils.owned_dir import OwnedDir

log = get_logger(__name__)

DEFAULT_ENTITIES = 240
DEFAULT_SEED = 0
WIKI = "https://en.wikipedia.org/wiki/"
COMMONS = "https://upload.wikimedia.org/wikipedia/commons/"
KB_IMAGE_PARTS = 3
MULTI_ENTITY_SHARE = 0.4  # share of E-VQA questions whose image shows 2-3 entities
TWO_HOP_SHARE = 0.35  # share of entities with a 2_hop question
UNSEEN_EVQA_EVERY = 7  # every 7th entity (coprime to the 6 categories): no E-VQA training question
INFOSEEK_SHARE = 0.67  # share of entities with InfoSeek questions
KNOWN_MISSING_INFOSEEK_IMAGE = "oven_05001795"  # missing in the real release too (mKG-RAG)
WORLD_MAX_MISSING = 0.34  # data.images.max_missing_fraction of the world's configs
# Image folders as the releases lay them out, relative to each release's folder in the world (evqa/, infoseek/):
# OMGM's wiki images (README "Wiki Images": output/ holds the CSVs, full/wiki_image_split/ the images; img_path
# `full/wiki_image_split/wiki_entity_image_N/FILE` is relative to the folder holding full/, utils/utils.py:77 and
# :101), iNaturalist 2021's `train/` and `val/` category folders with EchoSight's id2name maps beside them
# (EchoSight README: "put id2name file in the same folder"), InfoSeek's images per split.
WIKI_IMAGE = "wiki_image"
WIKI_IMAGE_CSVS = f"{WIKI_IMAGE}/output/wiki_image_url_part_*_processed.csv"
URL_STORE = "kb_image_url_store"  # qkvqa's own fallback pixels (not a release): {host}/{path}
INAT_ROOT = "images/inaturalist"
INFOSEEK_IMAGES = {"val": "infoseek/images/val", "train": "infoseek/images/train"}
# The release folders (data.root of preset evqa_data and infoseek_data, and of demo_world: evqa/) with the KB file each
# holds, and where the presets keep its store.
RELEASES = {"evqa": "encyclopedic_kb_wiki.json", "infoseek": "wiki_100_dict_v4.json"}
RELEASE_STORE = "kb_store"

EVQA_COLUMNS = (
    "question",
    "answer",
    "dataset_image_ids",
    "dataset_category_id",
    "dataset_name",
    "question_type",
    "wikipedia_url",
    "wikipedia_title",
    "evidence",
    "evidence_section_id",
    "evidence_section_title",
    "encyclopedic_vqa_split",
    "question_original",
    "wikipedia_url_used_in_train",
)

REGIONS = [
    "the Andes",
    "Borneo",
    "the Balkans",
    "Patagonia",
    "the Sahel",
    "Madagascar",
    "the Caucasus",
    "Tasmania",
    "the Yucatán Peninsula",
    "Sumatra",
    "the Atlas Mountains",
    "Scandinavia",
    "the Great Rift Valley",
    "New Caledonia",
    "the Pampas",
]
SEAS = [
    "the Red Sea",
    "the Coral Sea",
    "the Baltic Sea",
    "the Gulf of Guinea",
    "the Sea of Japan",
    "the Caribbean Sea",
    "the Tasman Sea",
    "the Arabian Sea",
]
COUNTRIES = [
    "Chile",
    "Peru",
    "Kenya",
    "Norway",
    "Vietnam",
    "Morocco",
    "Brazil",
    "Finland",
    "Ghana",
    "Portugal",
    "Nepal",
    "Mexico",
    "Romania",
    "Laos",
    "Oman",
    "Ecuador",
    "Iceland",
    "Japan",
]
STATUSES = ["Least Concern", "Near Threatened", "Vulnerable", "Endangered", "Critically Endangered"]
PEOPLE = [
    "Amelia Hart",
    "Jonas Berg",
    "Lucía Ortega",
    "Kenji Mori",
    "Ada Okafor",
    "Pierre Lenoir",
    "Maja Novak",
    "Samuel Reyes",
    "Ingrid Dahl",
    "Tomás Silva",
]
ARCHITECTS = [
    "Elena Varga",
    "Oskar Lind",
    "Hana Sato",
    "Rafael Duarte",
    "Grace Mbeki",
    "Louis Marchand",
    "Vera Kovac",
    "Arjun Rao",
]  # never used as distractor names, so the answer is only in "Design"
CITIES = ["Velmora", "Ostrava", "Caldera", "Tessin", "Brava", "Korvik", "Lunden", "Arlés", "Mirabel", "Quillan"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
HERITAGE = ["a national monument", "a World Heritage Site", "a protected cultural property", "a Grade I building"]
SYLLABLES = [
    "var",
    "nel",
    "tor",
    "mi",
    "sa",
    "kel",
    "dor",
    "lin",
    "bra",
    "fen",
    "qua",
    "ril",
    "ost",
    "mar",
    "ven",
    "tal",
    "gro",
    "sen",
    "pa",
    "lum",
]
UNICODE_STEMS = ["Ærø", "Ñandú", "Ōtaki", "Zürich", "Škofja", "Łódź", "Çatal", "Ísafjörð", "Sønder", "Kraków"]


@dataclass(frozen=True)
class FactSpec:
    """One fact of a category: its section, the sentence that states it and the questions that ask it."""

    key: str
    section: str  # section title ("" = the lead section, titled with the article title)
    kind: str  # year | number | choice | list
    sentence: str  # "{name}" and "{value}" are filled in
    templated: str  # contains "this <category noun>" exactly once (2_hop rewrites it)
    automatic: str
    pool: tuple = ()  # choice / list values, or (low, high, unit) for numbers


def _facts(specs: dict[str, tuple]) -> tuple[FactSpec, ...]:
    """FactSpecs from {key: (section, kind, sentence, templated, automatic[, pool])}."""
    return tuple(FactSpec(key, *spec) for key, spec in specs.items())


def unsurveyed_key(key: str) -> str:
    """`diet` for `diet_early` / `diet_recent` (and for `diet`)."""
    for survey in SURVEYS:
        key = key.removesuffix(f"_{survey}")
    return key


def other_survey(key: str) -> Optional[str]:
    """The key of the same fact as the other survey states it (`diet_recent` for `diet_early`), or None for a fact
    that is not stated per survey: in a bound-facts world, the rival of a question's evidence."""
    base, _, survey = key.rpartition("_")
    if survey not in SURVEYS:
        return None
    return f"{base}_{SURVEYS[1 - SURVEYS.index(survey)]}"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _surveyed(fact: FactSpec) -> tuple[FactSpec, ...]:
    """A non-lead fact as stated by each of SURVEYS (keys `diet_early`, `diet_recent`); the lead fact unchanged."""
    if not fact.section:
        return (fact,)
    return tuple(
        FactSpec(
            f"{fact.key}_{survey}",
            fact.section,
            fact.kind,
            f"{survey.capitalize()} surveys report that {_lower_first(fact.sentence)}",
            f"According to {survey} surveys, {_lower_first(fact.templated)}",
            f"According to {survey} surveys, {_lower_first(fact.automatic)}",
            fact.pool,
        )
        for survey in SURVEYS
    )


# The facts several categories share, worded with the category's noun ("this bird", "this fish"), as the tuples
# `_facts` takes; `_species` frames an iNaturalist category with the first and last of them.
def _described(noun: str) -> tuple:
    return (
        "",
        "year",
        "The {name} was first described by {person} in {value}.",
        f"In which year was this {noun} first described?",
        f"When was this {noun} first described?",
    )


def _native(noun: str, section: str, subject: str, place: str, places: list[str]) -> tuple:
    return (
        section,
        "choice",
        f"{subject} is native to {{value}}.",
        f"Which {place} is this {noun} native to?",
        f"Where is this {noun} native to?",
        tuple(places),
    )


def _diet(noun: str, foods: tuple) -> tuple:
    return (
        "Diet",
        "choice",
        "Its diet consists mainly of {value}.",
        f"What does the diet of this {noun} consist of mainly?",
        f"What is the main diet of this {noun}?",
        foods,
    )


def _depth(noun: str, low: int, high: int) -> tuple:
    return (
        "Habitat",
        "number",
        "It lives at depths of up to {value}.",
        f"To what depths does this {noun} live?",
        f"Up to what depths does this {noun} live?",
        (low, high, "metres"),
    )


def _status(noun: str) -> tuple:
    return (
        "Conservation",
        "choice",
        "The conservation status of the {name} is {value}.",
        f"What is the conservation status of this {noun}?",
        f"Which conservation status does this {noun} have?",
        tuple(STATUSES),
    )


def _species(noun: str, suffixes: list[str], fillers: list[str], facts: dict[str, tuple]) -> dict[str, Any]:
    """An iNaturalist category: the year it was first described (its lead fact), `facts`, its conservation status."""
    return dict(
        noun=noun,
        dataset="inaturalist",
        suffixes=suffixes,
        fillers=fillers,
        facts=_facts({"described": _described(noun), **facts, "status": _status(noun)}),
    )


CATEGORIES: dict[str, dict[str, Any]] = {
    "bird": _species(
        "bird",
        ["warbler", "finch", "heron", "kestrel", "thrush"],
        ["Etymology", "Behaviour"],
        {
            "wingspan": (
                "Description",
                "number",
                "The wingspan of the {name} measures {value}.",
                "What is the wingspan of this bird?",
                "How wide is the wingspan of this bird?",
                (18, 140, "cm"),
            ),
            "native": _native("bird", "Distribution and habitat", "The species", "region", REGIONS),
            "breeding_countries": (
                "Range",
                "list",
                "Breeding populations have been recorded in {value}.",
                "In which countries have breeding populations of this bird been recorded?",
                "Where have breeding populations of this bird been recorded?",
                tuple(COUNTRIES),
            ),
            "diet": _diet("bird", ("seeds", "insects", "small fish", "berries", "nectar", "snails", "earthworms")),
            "clutch": (
                "Breeding",
                "number",
                "A typical clutch contains {value}.",
                "How many eggs does a typical clutch of this bird contain?",
                "What is the typical clutch size of this bird?",
                (2, 9, "eggs"),
            ),
        },
    ),
    "plant": _species(
        "plant",
        ["orchid", "fern", "sedge", "lily", "thistle"],
        ["Etymology", "Taxonomy"],
        {
            "height": (
                "Description",
                "number",
                "The plant grows to a height of {value}.",
                "What height does this plant grow to?",
                "What height can this plant reach?",
                (1, 40, "metres"),
            ),
            "native": _native("plant", "Distribution", "The species", "region", REGIONS),
            "cultivated": (
                "Cultivation",
                "list",
                "It is cultivated in {value}.",
                "In which countries is this plant cultivated?",
                "Where is this plant cultivated?",
                tuple(COUNTRIES),
            ),
            "flowering": (
                "Flowering",
                "choice",
                "Its flowering season peaks in {value}.",
                "In which month does the flowering season of this plant peak?",
                "When is the flowering season of this plant?",
                tuple(MONTHS),
            ),
            "uses": (
                "Uses",
                "choice",
                "It is traditionally used for {value}.",
                "What is this plant traditionally used for?",
                "For what is this plant traditionally used?",
                ("dye", "medicine", "rope", "tea", "ornamental hedges", "basketry"),
            ),
        },
    ),
    "fish": _species(
        "fish",
        ["goby", "wrasse", "perch", "darter", "snapper"],
        ["Etymology", "Behaviour"],
        {
            "length": (
                "Description",
                "number",
                "Adults reach a maximum length of {value}.",
                "What maximum length do adults of this fish reach?",
                "How long can adults of this fish grow?",
                (5, 180, "cm"),
            ),
            "depth": _depth("fish", 2, 900),
            "native": _native("fish", "Distribution", "The fish", "sea", SEAS),
            "fished": (
                "Fisheries",
                "list",
                "It is commercially fished off {value}.",
                "Off which countries is this fish commercially fished?",
                "Where is this fish commercially fished?",
                tuple(COUNTRIES),
            ),
            "diet": _diet("fish", ("plankton", "crustaceans", "algae", "small squid", "worms")),
        },
    ),
    "shell": _species(
        "mollusc",
        ["cowrie", "whelk", "cone", "scallop", "nerite"],
        ["Etymology", "Taxonomy"],
        {
            "shell_length": (
                "Description",
                "number",
                "The shell length ranges up to {value}.",
                "What is the shell length of this mollusc?",
                "How large is the shell length of this mollusc?",
                (4, 300, "mm"),
            ),
            "depth": _depth("mollusc", 1, 600),
            "native": _native("mollusc", "Distribution", "The mollusc", "sea", SEAS),
            "collected": (
                "Shell collecting",
                "list",
                "Its shells are collected on the coasts of {value}.",
                "On the coasts of which countries are the shells of this mollusc collected?",
                "Where are the shells of this mollusc collected?",
                tuple(COUNTRIES),
            ),
            "predators": (
                "Predators",
                "choice",
                "It is preyed upon mainly by {value}.",
                "What is this mollusc preyed upon mainly by?",
                "Which animals prey upon this mollusc?",
                ("octopuses", "sea stars", "crabs", "shorebirds", "otters"),
            ),
        },
    ),
    "insect": _species(
        "insect",
        ["beetle", "moth", "hawker", "cicada", "skipper"],
        ["Etymology", "Behaviour"],
        {
            "wingspan": (
                "Description",
                "number",
                "The wingspan of adults is {value}.",
                "What is the wingspan of this insect?",
                "How wide is the wingspan of this insect?",
                (8, 160, "mm"),
            ),
            "native": _native("insect", "Distribution", "The species", "region", REGIONS),
            "introduced": (
                "Introductions",
                "list",
                "It has been introduced to {value}.",
                "To which countries has this insect been introduced?",
                "Where has this insect been introduced?",
                tuple(COUNTRIES),
            ),
            "host": (
                "Host plants",
                "choice",
                "The larvae feed on {value}.",
                "What do the larvae of this insect feed on?",
                "Which plant do the larvae of this insect feed on?",
                ("oak", "willow", "nettle", "clover", "birch", "heather"),
            ),
            "lifespan": (
                "Life cycle",
                "number",
                "Adults live for about {value}.",
                "How many days do adults of this insect live for?",
                "How long do adults of this insect live?",
                (3, 60, "days"),
            ),
        },
    ),
    "landmark": dict(
        noun="landmark",
        dataset="landmarks",
        suffixes=["Tower", "Bridge", "Abbey", "Lighthouse", "Gate"],
        fillers=["Name", "Legends"],
        facts=_facts(
            {
                "completed": (
                    "",
                    "year",
                    "The {name} was completed in {value}.",
                    "In which year was this landmark completed?",
                    "When was this landmark completed?",
                ),
                "height": (
                    "Architecture",
                    "number",
                    "The structure rises to a height of {value}.",
                    "What height does this landmark rise to?",
                    "What is the height of this landmark?",
                    (12, 320, "metres"),
                ),
                "architect": (
                    "Design",
                    "choice",
                    "It was designed by the architect {value}.",
                    "Which architect designed this landmark?",
                    "Who was the architect that designed this landmark?",
                    tuple(ARCHITECTS),
                ),
                "city": (
                    "Location",
                    "choice",
                    "It stands in the city of {value}.",
                    "In which city does this landmark stand?",
                    "Which city is this landmark in?",
                    tuple(CITIES),
                ),
                "materials": (
                    "Construction",
                    "list",
                    "It was built from {value}.",
                    "What materials was this landmark built from?",
                    "Which materials was this landmark built from?",
                    ("granite", "limestone", "brick", "marble", "oak timber", "sandstone", "iron", "slate"),
                ),
                "visitors": (
                    "Tourism",
                    "number",
                    "It receives about {value} each year.",
                    "How many visitors does this landmark receive each year?",
                    "How many visitors come to this landmark each year?",
                    (10, 900, "thousand visitors"),
                ),
                "heritage": (
                    "Heritage status",
                    "choice",
                    "It is designated as {value}.",
                    "What is this landmark designated as?",
                    "As what heritage status is this landmark designated?",
                    tuple(HERITAGE),
                ),
            }
        ),
    ),
}

DISTRACTORS = [
    "Observers often remark on its {adj} appearance.",
    "Several local names are in use for the {noun}.",
    "A survey in {year} counted roughly {num} individuals at a single site.",
    "Specimens are held in the collections of several museums.",
    "Its appearance varies slightly between seasons.",
    "The {noun} features on a postage stamp issued in {year}.",
    "Photographs of the {noun} are popular with visitors to the area.",
    "It is mentioned in a {year} travel account by {person}.",
    "Researchers have catalogued {num} distinct variants in archives.",
    "Little is known about the {noun} outside the summer months.",
    "Its closest relative is thought to be the {other}.",
    "A small exhibition about the {noun} opened in {year}.",
    "Early accounts confused it with the {other}.",
    "Field notes from {year} describe it as {adj}.",
]
# Section titles of the dense layout (facts_per_section > 1): they say nothing about which facts a section holds.
DENSE_SECTION_TITLES = ["Overview", "Details", "Notes", "Background", "Field notes", "Records"]
# The bound-facts layout (`bound_facts`): every non-lead fact is stated twice, by early and by recent surveys, with
# different values, in different sections; a question names the surveys it asks about. Each section then holds the
# same words as the one that answers ("recent", "diet") bound in other pairs ("recent ... wingspan", "early ... diet").
SURVEYS = ("early", "recent")
ADJECTIVES = ["striking", "modest", "unusual", "elegant", "plain", "distinctive", "variable"]


@dataclass
class _Entity:
    index: int
    entity_id: str
    category: str
    title: str
    url: str
    category_id: int
    signature: Signature
    facts: dict[str, Any] = field(default_factory=dict)  # key -> value (list for list facts)
    answers: dict[str, str] = field(default_factory=dict)  # key -> E-VQA answer string
    sentences: dict[str, str] = field(default_factory=dict)  # key -> evidence sentence
    fact_section: dict[str, int] = field(default_factory=dict)  # key -> section index
    section_titles: list[str] = field(default_factory=list)
    image_mode: str = "csv"  # csv | url_store | none
    image_urls: list[str] = field(default_factory=list)
    related: Optional[int] = None  # entity of the 2_hop question
    bound: bool = False  # facts stated per survey (`bound_facts`)


def _facts_of(entity: _Entity) -> tuple[FactSpec, ...]:
    """The facts an entity's article states: its category's, or (bound facts) each non-lead one per survey."""
    facts = CATEGORIES[entity.category]["facts"]
    return tuple(f for fact in facts for f in _surveyed(fact)) if entity.bound else facts


def _noun(entity: _Entity) -> str:
    return CATEGORIES[entity.category]["noun"]


def _kind_word(entity: _Entity) -> str:
    """The kind an entity's title names ("heron" for "Kelfen heron"), as a question would say it."""
    return entity.title.rsplit(" ", 1)[-1].lower()


# ---------------------------------------------------------------------------------------------- entities


def _make_entities(count: int, rng: random.Random, bound: bool = False) -> list[_Entity]:
    categories = list(CATEGORIES)
    combos = [(a, b, p) for a in PALETTE for b in PALETTE if a != b for p in PATTERNS]
    combo_order = {c: rng.sample(combos, len(combos)) for c in categories}
    used_titles: set[str] = set()
    entities = []
    for index in range(count):
        category = categories[index % len(categories)]
        spec = CATEGORIES[category]
        while True:
            if index % 37 == 5:
                stem = UNICODE_STEMS[(index // 37) % len(UNICODE_STEMS)] + rng.choice(SYLLABLES)
            else:
                stem = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
            title = f"{stem} {rng.choice(spec['suffixes'])}"
            if title not in used_titles:
                break
        used_titles.add(title)
        colour, second, pattern = combo_order[category][index // len(categories)]
        entity = _Entity(
            index=index,
            entity_id=f"e{index:04d}",
            category=category,
            title=title,
            url=WIKI + title.replace(" ", "_"),
            category_id=1000 + index,
            signature=Signature(category, colour, second, pattern),
            bound=bound,
        )
        entity.image_mode = "none" if index % 20 == 7 else "url_store" if index % 20 == 13 else "csv"
        for fact in _facts_of(entity):
            value, answer = _fact_value(fact, rng)
            earlier = other_survey(fact.key) if fact.key.endswith(f"_{SURVEYS[-1]}") else None
            while earlier is not None and _same_value(value, entity.facts[earlier]):
                value, answer = _fact_value(fact, rng)  # the surveys disagree, so only one answers a question
            entity.facts[fact.key], entity.answers[fact.key] = value, answer
        entities.append(entity)
    for entity in entities:
        if rng.random() < TWO_HOP_SHARE:
            others = [e for e in entities if e.category != entity.category]
            entity.related = rng.choice(others).index
    return entities


def _fact_value(fact: FactSpec, rng: random.Random) -> tuple[Any, str]:
    """(value, answer string as it appears in the sentence; list items joined by && for multi_answer)."""
    if fact.kind == "year":
        year = rng.randint(1758, 1990)
        return year, str(year)
    if fact.kind == "number":
        low, high, unit = fact.pool
        number = rng.randint(low, high)
        return number, f"{number} {unit}"
    if fact.kind == "choice":
        value = rng.choice(fact.pool)
        return value, value
    items = rng.sample(list(fact.pool), 3)
    return items, "&&".join(items)


def _same_value(a: Any, b: Any) -> bool:
    return sorted(a) == sorted(b) if isinstance(a, list) else a == b


def _render_value(entity: _Entity, key: str) -> str:
    value = entity.facts[key]
    if isinstance(value, list):
        return f"{value[0]}, {value[1]} and {value[2]}"
    return entity.answers[key]


# ---------------------------------------------------------------------------------------------- articles


def _other_number(entity: _Entity, rng: random.Random, low: int, high: int) -> int:
    """A number (or year) for a distractor sentence that is not one of the entity's answers."""
    while True:
        number = rng.randint(low, high)
        if number not in entity.facts.values():
            return number


def _distractors(entity: _Entity, entities: list[_Entity], rng: random.Random, count: int) -> list[str]:
    chosen = rng.sample(DISTRACTORS, count)
    return [
        s.format(
            adj=rng.choice(ADJECTIVES),
            noun=_noun(entity),
            year=_other_number(entity, rng, 1850, 2015),
            num=_other_number(entity, rng, 12, 480),
            person=rng.choice(PEOPLE),
            other=rng.choice(entities).title,
        )
        for s in chosen
    ]


def _paragraph(fact_sentences: list[str], distractors: list[str], rng: random.Random) -> str:
    sentences = list(distractors)
    for fact_sentence in fact_sentences:
        sentences.insert(rng.randint(0, len(sentences)), fact_sentence)
    return " ".join(sentences)


def _group_facts(facts: tuple[FactSpec, ...], facts_per_section: int, rng: random.Random) -> dict[str, list[FactSpec]]:
    """Section title -> the facts it states: each fact in its own titled section (1), or the non-lead facts
    shuffled into generic sections of `facts_per_section` each, so that only the text tells where a fact is.
    Two surveys' statements of one fact (bound facts) never share a section."""
    lead = [fact for fact in facts if not fact.section]
    if facts_per_section <= 1:
        grouped: dict[str, list[FactSpec]] = {}
        for fact in facts:
            grouped.setdefault(fact.section, []).append(fact)
        return grouped
    content = [fact for fact in facts if fact.section]
    while True:
        rng.shuffle(content)
        groups = [content[i : i + facts_per_section] for i in range(0, len(content), facts_per_section)]
        if all(len({unsurveyed_key(fact.key) for fact in group}) == len(group) for group in groups):
            break
    return {"": lead, **dict(zip(rng.sample(DENSE_SECTION_TITLES, len(groups)), groups))}


def _build_article(entity: _Entity, entities: list[_Entity], rng: random.Random, facts_per_section: int = 1) -> dict:
    """The KB entry of an entity; records in `entity` which section holds each fact."""
    spec = CATEGORIES[entity.category]
    sig = entity.signature
    look = f"The {entity.title} is easy to recognise by its {sig.colour} and {sig.second_colour} {sig.pattern}."
    sections: list[tuple[str, str]] = []
    facts_by_section = _group_facts(_facts_of(entity), facts_per_section, rng)
    content_titles = [s for s in facts_by_section if s] + list(spec["fillers"])
    rng.shuffle(content_titles)
    if entity.index % 11 == 3:
        content_titles.insert(rng.randint(0, len(content_titles)), "Gallery")  # an empty section
    for section_title in [""] + content_titles:
        sentences = []
        for fact in facts_by_section.get(section_title, []):
            sentence = fact.sentence.format(
                name=entity.title, person=rng.choice(PEOPLE), value=_render_value(entity, fact.key)
            )
            entity.sentences[fact.key] = sentence
            entity.fact_section[fact.key] = len(sections)
            sentences.append(sentence)
        if section_title == "Gallery":
            sections.append(("Gallery", ""))
            continue
        text = _paragraph(sentences, _distractors(entity, entities, rng, rng.randint(2, 4)), rng)
        if section_title == "":
            text = f"The {entity.title} is a {_noun(entity)}. {look} {text}"
            if entity.related is not None:
                text += f" It is frequently associated with the {entities[entity.related].title}."
        elif section_title == "Description":
            text = f"{text} {look}"
        sections.append((section_title or entity.title, text))
    person, year = rng.choice(PEOPLE), _other_number(entity, rng, 1850, 2015)
    sections.append(
        (
            "References",
            f"{person} ({year}). Notes on the {entity.title}. Journal of Field Studies "
            f"{_other_number(entity, rng, 1, 90)}: {_other_number(entity, rng, 1, 400)}.",
        )
    )
    sections.append(
        (
            "External links",
            f"{entity.title} at the Example Biodiversity Database. Media related to {entity.title} at Example Commons.",
        )
    )
    entity.section_titles = [title for title, _ in sections]
    image_count = 0 if entity.image_mode == "none" else rng.randint(1, 3)
    entity.image_urls = [_commons_url(f"{entity.title.replace(' ', '_')}_{k}.jpg") for k in range(image_count)]
    return {
        "url": entity.url,
        "title": entity.title,
        "section_titles": entity.section_titles,
        "section_texts": [text for _, text in sections],
        "image_urls": entity.image_urls,
        "image_reference_descriptions": [f"A {sig.colour} {_noun(entity)} ({k + 1})" for k in range(image_count)],
        "image_section_indices": [rng.randrange(len(content_titles) + 1) for _ in range(image_count)],
    }


def _commons_url(file_name: str) -> str:
    digest = hashlib.md5(file_name.encode("utf-8")).hexdigest()
    return f"{COMMONS}{digest[0]}/{digest[:2]}/{file_name}"


# ---------------------------------------------------------------------------------------------- images


class _ImageWriter:
    """Renders and writes every image once, and records what each shows."""

    def __init__(self, out: Path, seed: int):
        self.out = out
        self.seed = seed
        self.count = 0
        self.records: dict[str, dict] = {}

    def write(
        self,
        key: str,
        rel_path: str,
        entities: list[_Entity],
        kind: str,
        status: str = "ok",
        image_format: str = "JPEG",
    ) -> None:
        """Render `entities` (one, or several side by side) to `rel_path`; `status` missing/corrupt for skips."""
        if key in self.records:
            return
        self.records[key] = {
            "path": rel_path,
            "entities": [e.entity_id for e in entities],
            "kind": kind,
            "status": status,
        }
        if status == "missing":
            return
        self.count += 1
        rng = np.random.default_rng([self.seed, self.count])
        data = encode(render([e.signature for e in entities], rng, query_view=kind != "article"), image_format)
        if status == "corrupt":
            data = data[: len(data) // 3]
        path = self.out / rel_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _inat_id(counter: int) -> str:
    return str(2_000_000 + counter * 7)


def _landmark_id(seed: int, counter: int) -> str:
    return hashlib.md5(f"gld-{seed}-{counter}".encode()).hexdigest()[:16]


class _QueryImages:
    """Query image ids per dataset and pool (train / eval), with the multi-entity groups."""

    def __init__(
        self,
        writer: _ImageWriter,
        entities: list[_Entity],
        rng: random.Random,
        seed: int,
        same_category_groups: bool = False,
    ):
        self.writer = writer
        self.same_category_groups = same_category_groups
        self.entities = entities
        self.seed = seed
        self.counter = 0
        self.id2name: dict[str, dict[str, str]] = {"train": {}, "eval": {}}
        self.single: dict[tuple[str, int], str] = {}  # (pool, entity) -> image id
        self.group_of: dict[tuple[str, int], list[int]] = {}  # (pool, entity) -> entities in its multi image
        self.multi: dict[tuple[str, str, tuple], str] = {}  # (pool, dataset, group) -> image id
        for pool in ("train", "eval"):
            order = rng.sample(range(len(entities)), len(entities))
            while order:
                group = [order.pop(0)]
                size = rng.choice((2, 3))
                for candidate in list(order):
                    if len(group) == size:
                        break
                    if self._fits(entities[candidate], [entities[g] for g in group]):
                        group.append(candidate)
                        order.remove(candidate)
                if len(group) > 1:
                    for member in group:
                        self.group_of[(pool, member)] = group

    def _fits(self, candidate: _Entity, group: list[_Entity]) -> bool:
        """Whether `candidate` may join a multi-entity image: another category (mixed groups), or the same
        category with another kind word (same-category groups: only the question's kind word tells them apart)."""
        if self.same_category_groups:
            return candidate.category == group[0].category and _kind_word(candidate) not in {
                _kind_word(member) for member in group
            }
        return candidate.category not in {member.category for member in group}

    def new_id(self, dataset: str) -> str:
        self.counter += 1
        return _inat_id(self.counter) if dataset == "inaturalist" else _landmark_id(self.seed, self.counter)

    def path_of(self, dataset: str, pool: str, image_id: str, category: str) -> str:
        """Where an image id lives in the world (and, for iNaturalist, its id2name entry)."""
        if dataset == "landmarks":
            return f"evqa/images/landmarks/{image_id[0]}/{image_id[1]}/{image_id[2]}/{image_id}.jpg"
        folder = "train" if pool == "train" else "val"
        category_dir = f"{list(CATEGORIES).index(category):05d}_{category}"
        digest = hashlib.md5(image_id.encode()).hexdigest()  # iNat 2021 names its files by UUID
        uuid = f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:]}"
        name = f"{folder}/{category_dir}/{uuid}.jpg"
        self.id2name[pool][image_id] = name
        return f"evqa/images/inaturalist/{name}"

    def single_view(self, pool: str, entity: _Entity, status: str = "ok") -> str:
        key = (pool, entity.index)
        if key not in self.single or status != "ok":
            dataset = CATEGORIES[entity.category]["dataset"]
            image_id = self.new_id(dataset)
            self.writer.write(
                f"{dataset}/{image_id}",
                self.path_of(dataset, pool, image_id, entity.category),
                [entity],
                "single",
                status,
            )
            if status != "ok":
                return image_id
            self.single[key] = image_id
        return self.single[key]

    def multi_view(self, pool: str, entity: _Entity) -> Optional[str]:
        group = self.group_of.get((pool, entity.index))
        if group is None:
            return None
        dataset = CATEGORIES[entity.category]["dataset"]
        key = (pool, dataset, tuple(group))
        if key not in self.multi:
            image_id = self.new_id(dataset)
            self.writer.write(
                f"{dataset}/{image_id}",
                self.path_of(dataset, pool, image_id, entity.category),
                [self.entities[g] for g in group],
                "multi",
            )
            self.multi[key] = image_id
        return self.multi[key]


# ---------------------------------------------------------------------------------------------- questions


def _evqa_questions(entities: list[_Entity], images: _QueryImages, rng: random.Random) -> dict[str, list[dict]]:
    """E-VQA rows per split, each with its world record (gold entity, evidence, entities in the image)."""
    rows: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for entity in entities:
        for fact in _facts_of(entity):
            if fact.kind == "list":
                qtype, text = "multi_answer", fact.templated
            else:
                qtype = rng.choice(("templated", "automatic"))
                text = fact.templated if qtype == "templated" else fact.automatic
            split = rng.choices(("train", "val", "test"), weights=(70, 15, 15))[0]
            if split == "train" and entity.index % UNSEEN_EVQA_EVERY == 3:
                split = ("val", "test")[len(rows["test"]) % 2]  # an unseen subject (the rng draws stay the same)
            rows[split].append(_evqa_row(entity, fact.key, text, qtype, split, images, rng, entities))
        if entity.related is not None:
            other = entities[entity.related]
            fact = rng.choice([f for f in _facts_of(other) if f.kind != "list"])
            text = fact.templated.replace(
                f"this {_noun(other)}", f"the {_noun(other)} that this {_noun(entity)} is frequently associated with"
            )
            split = rng.choices(("train", "val", "test"), weights=(50, 25, 25))[0]
            row = _evqa_row(entity, fact.key, text, "2_hop", split, images, rng, entities, hop=other)
            rows[split].append(row)
    for split_rows in rows.values():
        rng.shuffle(split_rows)
    return rows


def _evqa_row(
    entity: _Entity,
    key: str,
    question: str,
    qtype: str,
    split: str,
    images: _QueryImages,
    rng: random.Random,
    entities: list[_Entity],
    hop: Optional[_Entity] = None,
) -> dict:
    pool = "train" if split == "train" else "eval"
    dataset = CATEGORIES[entity.category]["dataset"]
    single = images.single_view(pool, entity)
    multi = images.multi_view(pool, entity) if rng.random() < MULTI_ENTITY_SHARE else None
    image_ids = [multi, single] if multi is not None else [single]
    answer_entity = hop or entity
    if hop is None and images.same_category_groups:
        question = question.replace(f"this {_noun(entity)}", f"this {_kind_word(entity)}")
    section = entity.fact_section[key] if hop is None else 0
    if hop is None:
        evidence = entity.sentences[key]
        urls, titles = entity.url, entity.title
        section_ids, section_titles = str(section), entity.section_titles[section]
    else:
        # 2_hop, as the release writes it (google-research encyclopedic_vqa/README.md): wikipedia_url,
        # evidence_section_id and evidence_section_title each hold one value per hop joined by '|': the lead section of
        # the entity in the image (it names the related entity), then the answer's section of the related entity.
        evidence = f"It is frequently associated with the {hop.title}. {hop.sentences[key]}"
        urls, titles = f"{entity.url}|{hop.url}", f"{entity.title}|{hop.title}"
        section_ids = f"{section}|{hop.fact_section[key]}"
        section_titles = f"{entity.section_titles[section]}|{hop.section_titles[hop.fact_section[key]]}"
    row = {
        "question": question,
        "answer": answer_entity.answers[key],
        "dataset_image_ids": "|".join(image_ids),
        "dataset_category_id": str(entity.category_id),
        "dataset_name": dataset,
        "question_type": qtype,
        "wikipedia_url": urls,
        "wikipedia_title": titles,
        "evidence": evidence,
        "evidence_section_id": section_ids,
        "evidence_section_title": section_titles,
        "encyclopedic_vqa_split": split,
        "question_original": question,
        "wikipedia_url_used_in_train": "",
    }
    image_key = f"{dataset}/{image_ids[0]}"
    record = {
        "entity": entity.entity_id,
        "fact": key,
        "question_type": qtype,
        "gold_urls": urls.split("|"),
        "evidence_section_id": section,
        "evidence_section_title": entity.section_titles[section],
        "answer_entity": answer_entity.entity_id,
        "answer_section_id": answer_entity.fact_section[key],
        "image_id": image_ids[0],
        "dataset_name": dataset,
        "image_entities": images.writer.records[image_key]["entities"],
    }
    return {"row": row, "record": record}


def _mark_deliberate_skips(evqa: dict[str, list[dict]], images: _QueryImages) -> list[dict]:
    """Give one iNaturalist test question a missing image and one landmarks test question a corrupt one."""
    skips = []
    for dataset, status in (("inaturalist", "missing"), ("landmarks", "corrupt")):
        item = next(
            q for q in evqa["test"] if q["row"]["dataset_name"] == dataset and q["row"]["question_type"] != "2_hop"
        )
        entity = next(e for e in images.entities if e.entity_id == item["record"]["entity"])
        image_id = images.single_view("eval", entity, status=status)
        item["row"]["dataset_image_ids"] = image_id
        item["record"].update(image_id=image_id, image_entities=[entity.entity_id])
        skips.append({"dataset_name": dataset, "image_id": image_id, "reason": status, "file": "evqa/test.csv"})
    return skips


def _infoseek_questions(entities: list[_Entity], writer: _ImageWriter, rng: random.Random) -> dict[str, list[dict]]:
    """InfoSeek val (reference + test CSV) and train questions; half the entities are unseen in train."""
    out: dict[str, list[dict]] = {"val": [], "train": []}
    counter = 0
    for entity in entities:
        if rng.random() >= INFOSEEK_SHARE:
            continue
        unseen_entity = rng.random() < 0.5
        facts = [f for f in _facts_of(entity) if f.kind != "list"]
        chosen = rng.sample(facts, 2)
        for split, fact in (("val", chosen[0]), ("train", chosen[1])):
            if split == "train" and unseen_entity:
                continue
            counter += 1
            image_id = f"oven_{counter * 11:08d}"
            if split == "val" and not out["val"]:
                image_id, status = KNOWN_MISSING_INFOSEEK_IMAGE, "missing"
            else:
                status = "ok"
            extension = ".JPEG" if counter % 6 == 0 else ".jpg"
            writer.write(
                f"infoseek/{image_id}", f"{INFOSEEK_IMAGES[split]}/{image_id}{extension}", [entity], "single", status
            )
            data_id = f"infoseek_{split}_{counter:08d}"
            out[split].append(_infoseek_item(entity, fact, data_id, image_id, split, unseen_entity))
    return out


def _infoseek_item(
    entity: _Entity, fact: FactSpec, data_id: str, image_id: str, split: str, unseen_entity: bool
) -> dict:
    value = entity.facts[fact.key]
    question = fact.templated
    if fact.kind == "number":
        qtype, answer = "Numerical", [str(value)]
        answer_eval: Any = [{"wikidata": float(value), "range": [round(value * 0.9, 2), round(value * 1.1, 2)]}]
        if entity.index % 2:
            answer_eval = answer_eval[0]  # the bare-dict shape also occurs in the release
    elif fact.kind == "year":
        qtype, answer, answer_eval = "Time", [str(value)], [str(value)]
    else:
        qtype, answer = "String", [value]
        answer_eval = list(dict.fromkeys([value, value.lower(), value.removeprefix("the ")]))
    section = entity.fact_section[fact.key]
    csv_answer = "|".join(answer_eval) if qtype == "String" else answer[0]
    row = {
        "data_id": data_id,
        "question": question,
        "answer": csv_answer,
        "dataset_image_ids": image_id,
        "dataset_category_id": str(entity.category_id),
        "dataset_name": "infoseek",
        "question_type": "infoseek",
        "wikipedia_url": entity.url,
        "wikipedia_title": entity.title,
        "evidence": entity.sentences[fact.key],
        "evidence_section_id": str(section),
        "evidence_section_title": entity.section_titles[section],
        "encyclopedic_vqa_split": split,
        "question_original": question,
        "wikipedia_url_used_in_train": "",
    }
    reference = {
        "data_id": data_id,
        "image_id": image_id,
        "question": question,
        "answer": answer,
        "answer_eval": answer_eval,
        "data_split": "val_unseen_entity" if unseen_entity else "val_unseen_question",
    }
    record = {
        "entity": entity.entity_id,
        "fact": fact.key,
        "infoseek_type": qtype,
        "gold_urls": [entity.url],
        "evidence_section_id": section,
        "evidence_section_title": entity.section_titles[section],
        "image_id": image_id,
        "image_entities": [entity.entity_id],
        "data_split": reference["data_split"],
    }
    return {"row": row, "reference": reference, "qtype": qtype, "record": record}


# ---------------------------------------------------------------------------------------------- writing


def _csv_text(columns: tuple, rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _write(out: Path, rel_path: str, text: str) -> None:
    path = out / rel_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _write_kb_images(out: Path, entities: list[_Entity], writer: _ImageWriter) -> dict[str, int]:
    """OMGM's title -> image CSVs and their images under evqa/wiki_image (output/ and full/, as released), the
    url store pixels of the fallback entities (titles the CSVs do not list); infoseek/ gets a copy of both."""
    import shutil

    parts: dict[int, list[list[str]]] = {k: [] for k in range(1, KB_IMAGE_PARTS + 1)}
    counts = {"csv_rows": 0, "url_store_images": 0}
    for entity in entities:
        part = entity.index % KB_IMAGE_PARTS + 1
        for k, url in enumerate(entity.image_urls):
            if entity.image_mode != "csv":
                if k == 0:
                    writer.write(f"article/{url}", f"evqa/{URL_STORE}/" + url.split("://", 1)[1], [entity], "article")
                    counts["url_store_images"] += 1
                continue
            file_name = url.rsplit("/", 1)[1]
            image_format = "PNG" if entity.index % 10 == 4 and k == 1 else "JPEG"
            if image_format == "PNG":
                file_name = file_name[:-4] + ".png"
            img_path = f"full/wiki_image_split/wiki_entity_image_{part}/{file_name}"
            parts[part].append([entity.title, url, img_path, f"Photograph of the {entity.title}"])
            counts["csv_rows"] += 1
            writer.write(
                f"article/{url}", f"evqa/{WIKI_IMAGE}/{img_path}", [entity], "article", image_format=image_format
            )
    for part, rows in parts.items():
        buffer = io.StringIO()
        csv_writer = csv.writer(buffer, lineterminator="\n")
        csv_writer.writerow(["title", "image_URL", "img_path", "caption"])
        csv_writer.writerows(rows)
        _write(out, f"evqa/{WIKI_IMAGE_CSVS.replace('*', str(part))}", buffer.getvalue())
    for folder in (WIKI_IMAGE, URL_STORE):
        if (out / "evqa" / folder).is_dir():  # a world under 14 entities has no url-store entity
            shutil.copytree(out / "evqa" / folder, out / "infoseek" / folder, dirs_exist_ok=True)
    return counts


def _data_configs(out: Path) -> dict[str, dict]:
    """DataConfig sections of the world (keys are exactly DataConfig / ImagesConfig fields)."""

    # The world leaves a few query images missing on purpose (counted skips); WORLD_MAX_MISSING keeps them
    # under the bound even in a 3-question subset, where the real-data default (2%) would stop the run.
    def kb_images(release: str) -> dict:
        return {
            "kb_image_csvs": [f"{release}/{WIKI_IMAGE_CSVS}"],
            "kb_image_root": f"{release}/{WIKI_IMAGE}",
            "kb_image_url_store": f"{release}/{URL_STORE}",
            "max_missing_fraction": WORLD_MAX_MISSING,
        }

    common = {"root": str(out.resolve()), "kb_source": "kb/encyclopedic_kb_wiki.json", "kb_store": "kb/store"}
    evqa = {
        "dataset": "evqa",
        **common,
        "train_questions": "evqa/train.csv",
        "val_questions": "evqa/val.csv",
        "test_questions": "evqa/test.csv",
        "images": {
            "inaturalist_root": f"evqa/{INAT_ROOT}",
            "inaturalist_layout": "id2name",
            "inaturalist_id2name": f"evqa/{INAT_ROOT}/train_id2name.json",
            "inaturalist_id2name_extra": [f"evqa/{INAT_ROOT}/val_id2name.json"],
            "landmarks_root": "evqa/images/landmarks",
            "landmarks_layout": "abc_sharded",
            **kb_images("evqa"),
        },
    }
    infoseek = {
        "dataset": "infoseek",
        **common,
        "train_questions": "infoseek/infoseek_train_filtered.csv",
        "test_questions": "infoseek/infoseek_test_filtered.csv",
        "infoseek_references": "infoseek/infoseek_val.jsonl",
        "infoseek_qtypes": "infoseek/infoseek_val_qtype.jsonl",
        "images": {"infoseek_root": INFOSEEK_IMAGES["val"], **kb_images("infoseek")},
    }
    return {"evqa": evqa, "infoseek": infoseek}


WORLD_MARKER = ".qkvqa-synth-world"  # in a world's folder: the files `qkvqa synth` wrote there


def _prepare_out_dir(owned: OwnedDir) -> set[str]:
    """Claim the world's folder (new, empty, or holding WORLD_MARKER; anything else is refused), remove the files an
    old world wrote there and return the files that stay (a user's own, which the new world's record leaves out)."""
    owned.remove_old(owned.claim(), ())
    return owned.all_files()


# Named worlds (`qkvqa synth --world NAME`): generate_world options. `focus` is the world where the section encoding
# must know the question (docs/training.md, "A world where question focus is needed"): sections of 3 facts in
# generic sections, and multi-entity images of one category whose questions name the kind word.
# `bound` is the world where the words of a question are in the evidence section and in its hard negatives alike, and
# only how a section pairs them tells which one answers (docs/training.md, "A world with bound facts").
WORLDS = {
    "default": {},
    "focus": {"facts_per_section": 3, "same_category_groups": True},
    "bound": {"facts_per_section": 3, "bound_facts": True},
}


def generate_world(
    out_dir: str | Path,
    entities: int = DEFAULT_ENTITIES,
    seed: int = DEFAULT_SEED,
    build_store: bool = True,
    facts_per_section: int = 1,
    same_category_groups: bool = False,
    bound_facts: bool = False,
) -> dict:
    """Write a synthetic world to `out_dir` (see the module docstring) and return its manifest (world.json).

    The same arguments give byte-identical KB, CSV, JSONL and image files.
    `facts_per_section` 1 puts each fact in its own titled section ("Diet", "Breeding"); k > 1 shuffles
    an article's non-lead facts into generic sections of k facts each ("Notes", "Details"), so that
    which section answers a question depends on the question and the section's text, not its title.
    `same_category_groups` makes each multi-entity image show 2-3 entities of one category with different
    kind words ("heron", "finch"), and single-hop E-VQA questions name that kind word ("this heron"): the
    query image alone cannot tell which entity is asked about, only the article text can.
    `bound_facts` states every non-lead fact twice, as early and as recent surveys report it (different values, in
    different sections of k >= 2 facts), and asks each with "According to recent surveys, ...": every section
    holds the question's words, and only the pairing of survey and fact inside a sentence tells which answers.
    """
    import yaml

    if entities < len(CATEGORIES) * 2:
        raise DataError(f"a synthetic world needs at least {len(CATEGORIES) * 2} entities, got {entities}")
    if facts_per_section < 1:
        raise DataError(f"facts_per_section must be at least 1, got {facts_per_section}")
    if bound_facts and not 2 <= facts_per_section <= 4:
        raise DataError(
            f"bound_facts needs 2-4 facts per section (each survey's statement of a fact in its own "
            f"generic section), got facts_per_section={facts_per_section}"
        )
    started = time.time()
    out = Path(out_dir)
    owned = OwnedDir(out, WORLD_MARKER, "qkvqa synth --out")
    users_files = _prepare_out_dir(owned)
    rng = random.Random(seed)
    world = _make_entities(entities, rng, bound_facts)
    kb = {entity.url: _build_article(entity, world, rng, facts_per_section) for entity in world}
    writer = _ImageWriter(out, seed)
    images = _QueryImages(writer, world, rng, seed, same_category_groups)
    evqa = _evqa_questions(world, images, rng)
    skips = _mark_deliberate_skips(evqa, images)
    infoseek = _infoseek_questions(world, writer, rng)
    skips.append(
        {
            "dataset_name": "infoseek",
            "image_id": KNOWN_MISSING_INFOSEEK_IMAGE,
            "reason": "missing",
            "file": "infoseek/infoseek_test_filtered.csv",
        }
    )
    kb_image_counts = _write_kb_images(out, world, writer)
    train_urls = {u for item in evqa["train"] for u in item["row"]["wikipedia_url"].split("|")}

    _write(out, "kb/encyclopedic_kb_wiki.json", json.dumps(kb, ensure_ascii=False))
    for release, kb_name in RELEASES.items():  # each release folder holds its KB as it downloads
        _write(out, f"{release}/{kb_name}", json.dumps(kb, ensure_ascii=False))
    _write(
        out,
        "kb/encyclopedic_kb_wiki.jsonl",
        "".join(json.dumps({url: entry}, ensure_ascii=False) + "\n" for url, entry in kb.items()),
    )
    questions: dict[str, list[dict]] = {}
    for split, items in evqa.items():
        single_hop = two_hop = 0
        for item in items:
            row = item["row"]
            row["wikipedia_url_used_in_train"] = str(all(u in train_urls for u in row["wikipedia_url"].split("|")))
            if row["question_type"] == "2_hop":
                item["record"]["data_id"], two_hop = f"E-VQA_2hop_{two_hop}", two_hop + 1
            else:
                item["record"]["data_id"], single_hop = f"E-VQA_{single_hop}", single_hop + 1
        _write(out, f"evqa/{split}.csv", _csv_text(EVQA_COLUMNS, [item["row"] for item in items]))
        questions[f"evqa/{split}.csv"] = [item["record"] for item in items]
    for pool, split in (("train", "train"), ("eval", "val")):
        _write(
            out, f"evqa/{INAT_ROOT}/{split}_id2name.json", json.dumps(images.id2name[pool], indent=1, sort_keys=True)
        )
    infoseek_columns = ("data_id",) + EVQA_COLUMNS
    _write(out, "infoseek/infoseek_test_filtered.csv", _csv_text(infoseek_columns, [i["row"] for i in infoseek["val"]]))
    _write(
        out, "infoseek/infoseek_train_filtered.csv", _csv_text(infoseek_columns, [i["row"] for i in infoseek["train"]])
    )
    _write(
        out,
        "infoseek/infoseek_val.jsonl",
        "".join(json.dumps(i["reference"], ensure_ascii=False) + "\n" for i in infoseek["val"]),
    )
    _write(
        out,
        "infoseek/infoseek_val_qtype.jsonl",
        "".join(
            json.dumps({"data_id": i["reference"]["data_id"], "question_type": i["qtype"]}) + "\n"
            for i in infoseek["val"]
        ),
    )
    for split, name in (
        ("val", "infoseek/infoseek_test_filtered.csv"),
        ("train", "infoseek/infoseek_train_filtered.csv"),
    ):
        questions[name] = [dict(i["record"], data_id=i["row"]["data_id"]) for i in infoseek[split]]

    configs = _data_configs(out)
    for name, config in configs.items():
        atomic_write_text(
            out / f"data_{name}.yaml",
            f"# DataConfig of the synthetic world ({name}); generated by `qkvqa synth`\n"
            + yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
        )
    if build_store:
        from qkvqa.data.kb import build_kb_store

        build_kb_store(out / "kb/encyclopedic_kb_wiki.json", out / "kb/store")
        for release, kb_name in RELEASES.items():  # `qkvqa kb build --source R/KB --out R/kb_store`, as the presets say
            build_kb_store(out / release / kb_name, out / release / RELEASE_STORE)

    manifest = {
        "seed": seed,
        "facts_per_section": facts_per_section,
        "same_category_groups": same_category_groups,
        "bound_facts": bound_facts,
        "counts": {
            "entities": len(world),
            "articles": len(kb),
            "articles_without_images": sum(e.image_mode == "none" for e in world),
            "articles_with_url_store_image_only": sum(e.image_mode == "url_store" for e in world),
            "images_written": writer.count,
            **kb_image_counts,
            **{f"questions:{name}": len(records) for name, records in questions.items()},
            "multi_entity_questions": sum(len(r["image_entities"]) > 1 for rs in questions.values() for r in rs),
        },
        "paths": {
            "kb_json": "kb/encyclopedic_kb_wiki.json",
            "kb_jsonl": "kb/encyclopedic_kb_wiki.jsonl",
            "kb_store": "kb/store" if build_store else None,
            "data_evqa": "data_evqa.yaml",
            "data_infoseek": "data_infoseek.yaml",
            **{f"questions:{n}": n for n in questions},
            "infoseek_references": "infoseek/infoseek_val.jsonl",
            "infoseek_qtypes": "infoseek/infoseek_val_qtype.jsonl",
            "train_id2name": f"evqa/{INAT_ROOT}/train_id2name.json",
            "val_id2name": f"evqa/{INAT_ROOT}/val_id2name.json",
            **{f"release:{name}": name for name in RELEASES},
        },
        "data_configs": configs,
        "deliberate_skips": skips,
        "entities": [
            {
                "entity_id": e.entity_id,
                "category": e.category,
                "title": e.title,
                "url": e.url,
                "signature": vars(e.signature),
                "image_mode": e.image_mode,
                "section_titles": e.section_titles,
                "facts": {
                    k: {"answer": e.answers[k], "section_id": e.fact_section[k], "sentence": e.sentences[k]}
                    for k in e.facts
                },
            }
            for e in world
        ],
        "questions": questions,
        "images": writer.records,
        "generation_seconds": round(time.time() - started, 2),
    }
    atomic_write_json(out / "world.json", manifest)
    owned.record(owned.all_files() - users_files)
    log.info(
        "synthetic world %s: %d entities, %d images, %s (%.1fs)",
        out,
        len(world),
        writer.count,
        ", ".join(f"{n} {len(r)}" for n, r in questions.items()),
        manifest["generation_seconds"],
    )
    return manifest
