"""The extension is ready for the Slicer Extensions Index: the index's description checks that need
no network, written here as our own code after reading the index's
``scripts/check_description_files.py`` (ExtensionsIndex commit 07f1d1b) and its pull request
template, run on the top-level ``CMakeLists.txt``, the entries (``Resources/ExtensionsIndex/CARDSegment.json``
for the index's ``main`` branch, ``Resources/ExtensionsIndex/<release>/CARDSegment.json`` for its
branches of the Slicer stable releases) and the files they point at. What needs the network (the
URLs downloading as images, the GitHub topic, the clone) is listed in ``Resources/ExtensionsIndex/README.md``.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
INDEX_DIR = REPO / "Resources" / "ExtensionsIndex"
#: the entry for the index's main branch (Slicer Preview Releases)
ENTRY = INDEX_DIR / "CARDSegment.json"
#: the index's branches of the Slicer stable releases the module supports (the index has a branch
#: for each: 5.8, 5.10 and 5.12 at ExtensionsIndex commit 07f1d1b); each entry builds the
#: repository's branch of the same name
RELEASE_BRANCHES = ("5.8", "5.10", "5.12")
ENTRIES = {"main": ENTRY, **{b: INDEX_DIR / b / "CARDSegment.json" for b in RELEASE_BRANCHES}}
#: the branch the icon and screenshot URLs name: one set of images, shown by every release's catalog
IMAGE_BRANCH = "main"
SCREENSHOTS = REPO / "Resources" / "Screenshots"
SHIPPED_BUNDLE = REPO / "CARDSegment" / "cardseg" / "bundles" / "acdc"

#: the catalog entry schema (v1.0.1): every key it allows, and the required ones
SCHEMA_URL = (
    "https://raw.githubusercontent.com/Slicer/Slicer/main/Schemas/slicer-extension-catalog-entry-schema-v1.0.1.json#"
)
ENTRY_TYPES = {
    "$schema": str,
    "category": str,
    "scm_url": str,
    "scm_revision": str,
    "scm_type": str,
    "build_dependencies": list,
    "build_subdirectory": str,
    "enabled": bool,
    "tier": int,
}
ENTRY_REQUIRED = {"$schema", "category", "scm_url"}
#: a few of the categories the index accepts (its list has about 60), the ones that fit this module
KNOWN_CATEGORIES = {"Segmentation", "Cardiac", "Quantification", "Analysis"}
#: words of the method that a non-expert reader of the catalog would not understand
JARGON = ("diffusion", "trajectory", "categorical", "calibrat", "myocard", "ventric", "reverse")
#: the index asks for 1-2 sentences; a sentence longer than this is hard to read in the catalog
MAX_SENTENCE_WORDS = 40
#: what the index's size check allows
MAX_REPOSITORY_MB = 100
#: what the extension template and the wizard write, and what this project had before
PLACEHOLDER_CONTRIBUTORS = {
    "cardsegment authors",
    "john doe",
    "jane roe",
    "joe bloggs",
    "anyware corp.",
    "anyware corp",
    "superware",
    "nowhere",
}
MAX_SCREENSHOT_BYTES = 300 * 1024


def cmake_settings(text: str) -> dict:
    """``set(EXTENSION_X "value")`` calls of a CMakeLists.txt (comments removed), in the strict
    form the index's parser needs: the quoted value and the closing parenthesis on one call."""
    text = re.sub(r"#[^\n]*", "", text)
    return dict(re.findall(r'set\s*\(\s*(EXTENSION_[A-Z]+)\s+"([^"]*)"\s*\)', text))


@pytest.fixture(scope="module")
def cmake():
    text = (REPO / "CMakeLists.txt").read_text(encoding="utf-8")
    project = re.search(r"^\s*project\s*\(\s*([^\s)]+)", re.sub(r"#[^\n]*", "", text), re.MULTILINE)
    return {"project": project.group(1) if project else None, **cmake_settings(text)}


@pytest.fixture(scope="module")
def entry():
    return json.loads(ENTRY.read_text(encoding="utf-8"))


@pytest.fixture(scope="module", params=sorted(ENTRIES))
def branch_entry(request):
    """``(index branch, path, entry)`` for each of the index's branches."""
    path = ENTRIES[request.param]
    return request.param, path, json.loads(path.read_text(encoding="utf-8"))


def github_repo(url: str) -> str:
    """ "owner/name" of a github.com or raw.githubusercontent.com URL."""
    parts = urlsplit(url).path.strip("/").split("/")
    return f"{parts[0]}/{parts[1].removesuffix('.git')}"


def raw_file(url: str, homepage: str, branch: str) -> Path:
    """The repository file a raw.githubusercontent.com URL names, after checking that it points into
    the homepage's repository on ``branch``."""
    split = urlsplit(url)
    assert split.scheme == "https" and split.netloc == "raw.githubusercontent.com", (
        f"{url}: not a raw download URL (the index needs the file itself, not its web page)"
    )
    parts = split.path.strip("/").split("/")
    assert github_repo(url) == github_repo(homepage), f"{url}: not in the homepage's repository {homepage}"
    assert parts[2] == branch, f"{url}: branch {parts[2]}, the index entry builds {branch}"
    return REPO.joinpath(*parts[3:])


def png_size(path: Path):
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG", f"{path}: not a PNG"
        return image.size


# --------------------------------------------------------------------------------------------
# the helpers above are what the checks rest on: they must refuse what the index refuses


def test_cmake_settings_reads_only_the_strict_form():
    text = (
        'set(EXTENSION_CATEGORY "Segmentation")\n# set(EXTENSION_HOMEPAGE "commented")\n'
        'set(EXTENSION_ICONURL\n  "https://x/y.png")\nset(EXTENSION_SCREENSHOTURLS "a.png" CACHE STRING "")\n'
    )
    assert cmake_settings(text) == {"EXTENSION_CATEGORY": "Segmentation", "EXTENSION_ICONURL": "https://x/y.png"}


def test_raw_file_refuses_web_pages_other_repositories_and_branches():
    home = "https://github.com/cardsegment/CARDSegment"
    assert (
        raw_file("https://raw.githubusercontent.com/cardsegment/CARDSegment/main/Resources/a.png", home, "main")
        == REPO / "Resources" / "a.png"
    )
    for url in (
        "https://github.com/cardsegment/CARDSegment/blob/main/Resources/a.png",
        "https://raw.githubusercontent.com/someone/CARDSegment/main/Resources/a.png",
        "https://raw.githubusercontent.com/cardsegment/CARDSegment/dev/Resources/a.png",
    ):
        with pytest.raises(AssertionError):
            raw_file(url, home, "main")


# --------------------------------------------------------------------------------------------
# the index entry


def test_entry_file_is_lf_only_json_named_after_the_cmake_project(cmake, branch_entry):
    _, path, _ = branch_entry
    raw = path.read_bytes()
    assert b"\r" not in raw, "the index refuses CR or CRLF line endings"
    json.loads(raw)
    assert cmake["project"] == path.stem == "CARDSegment"


def test_there_is_an_entry_for_each_index_branch_and_no_other():
    folders = {p.parent.name for p in INDEX_DIR.glob("*/*.json")}
    assert folders == set(RELEASE_BRANCHES), folders ^ set(RELEASE_BRANCHES)
    assert all(path.is_file() for path in ENTRIES.values())


def test_each_entry_builds_the_repository_branch_of_its_index_branch(branch_entry, entry):
    """main builds main; a release's entry builds the repository's branch named after that release,
    and differs from main's entry in nothing else."""
    branch, _, this = branch_entry
    assert this["scm_revision"] == branch
    assert {k: v for k, v in this.items() if k != "scm_revision"} == {
        k: v for k, v in entry.items() if k != "scm_revision"
    }


def test_the_readme_names_every_entry_and_its_revision():
    readme = (INDEX_DIR / "README.md").read_text(encoding="utf-8")
    for branch, path in ENTRIES.items():
        assert f"`{path.relative_to(INDEX_DIR).as_posix()}`" in readme, path
        assert f'`"scm_revision": "{branch}"`' in readme, branch


def test_entry_follows_the_catalog_schema(branch_entry):
    _, _, entry = branch_entry
    assert entry["$schema"] == SCHEMA_URL
    assert ENTRY_REQUIRED <= set(entry), f"missing {ENTRY_REQUIRED - set(entry)}"
    assert set(entry) <= set(ENTRY_TYPES), f"keys the schema does not allow: {set(entry) - set(ENTRY_TYPES)}"
    for key, value in entry.items():
        assert isinstance(value, ENTRY_TYPES[key]), f"{key}: {type(value).__name__}"
    assert all(isinstance(d, str) and d for d in entry.get("build_dependencies", []))
    assert entry.get("tier", 5) in (1, 3, 5)
    assert entry.get("scm_type", "git") == "git"


def test_extension_name_and_category(branch_entry, cmake):
    _, path, entry = branch_entry
    assert not path.stem.lower().startswith("slicer"), "the index wants extension names without 'Slicer'"
    assert entry["category"] in KNOWN_CATEGORIES
    assert entry["category"] == cmake["EXTENSION_CATEGORY"]


def test_entry_agrees_with_cmakelists(branch_entry, cmake):
    _, _, entry = branch_entry
    assert urlsplit(entry["scm_url"]).scheme in ("https", "git")
    assert github_repo(entry["scm_url"]) == github_repo(cmake["EXTENSION_HOMEPAGE"])
    assert sorted(entry.get("build_dependencies", [])) == sorted(cmake["EXTENSION_DEPENDS"].split())
    assert "PyTorch" in entry["build_dependencies"]
    assert entry.get("build_subdirectory", ".") == "."
    # the icon and screenshot URLs name the images' branch (raw_file checks it), the one main's entry builds
    for url in [cmake["EXTENSION_ICONURL"]] + cmake["EXTENSION_SCREENSHOTURLS"].split():
        raw_file(url, cmake["EXTENSION_HOMEPAGE"], IMAGE_BRANCH)


# --------------------------------------------------------------------------------------------
# the CMakeLists.txt description


def test_homepage_and_licence(cmake):
    home = urlsplit(cmake["EXTENSION_HOMEPAGE"])
    assert home.scheme == "https" and home.netloc == "github.com"
    assert (REPO / "LICENSE").is_file()


def test_icon_is_a_committed_128_pixel_png(cmake, entry):
    assert entry["scm_revision"] == IMAGE_BRANCH
    path = raw_file(cmake["EXTENSION_ICONURL"], cmake["EXTENSION_HOMEPAGE"], IMAGE_BRANCH)
    assert path.is_file(), f"{path}: the icon URL points at no file of the repository"
    assert png_size(path) == (128, 128)


def test_screenshots_are_committed_small_pngs(cmake):
    urls = cmake["EXTENSION_SCREENSHOTURLS"].split()
    assert urls, "the index wants at least one screenshot"
    for url in urls:
        path = raw_file(url, cmake["EXTENSION_HOMEPAGE"], IMAGE_BRANCH)
        assert path.parent == SCREENSHOTS and path.is_file(), f"{url}: no such screenshot"
        assert path.stat().st_size <= MAX_SCREENSHOT_BYTES, f"{path.name}: {path.stat().st_size} bytes"
        width, height = png_size(path)
        assert width >= 800 and height >= 400


def test_screenshots_are_shown_and_explained(cmake):
    names = [Path(urlsplit(u).path).name for u in cmake["EXTENSION_SCREENSHOTURLS"].split()]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    slicer_page = (REPO / "docs" / "getting-started" / "slicer.md").read_text(encoding="utf-8")
    notes = (SCREENSHOTS / "README.md").read_text(encoding="utf-8")
    assert f"](Resources/Screenshots/{names[0]})" in readme, f"the README does not show {names[0]}"
    for name in names:
        assert f"](../../Resources/Screenshots/{name})" in slicer_page, f"the Slicer module's page does not show {name}"
        assert f"`{name}`" in notes, f"Resources/Screenshots/README.md does not say what {name} is"
    assert (SCREENSHOTS / "make_screenshots.py").is_file()


def test_screenshots_come_from_the_shipped_bundle():
    """The run behind the screenshots used the shipped weights (their SHA-256 in its report)."""
    report = json.loads((SCREENSHOTS / "phantom-report.json").read_text(encoding="utf-8"))
    bundle = json.loads((SHIPPED_BUNDLE / "bundle.json").read_text(encoding="utf-8"))
    assert report["bundle"]["id"] == f"{bundle['id']['name']}-{bundle['id']['version']}"
    for name, digest in report["bundle"]["checksums"].items():
        assert hashlib.sha256((SHIPPED_BUNDLE / name).read_bytes()).hexdigest() == digest, (
            f"{name} changed since the screenshots were made: run Resources/Screenshots/make_screenshots.py"
        )
    assert (REPO / report["input"]).is_file() and "SampleData" in report["input"]


def test_contributors_are_names_with_affiliations(cmake):
    entries = [e.strip() for e in cmake["EXTENSION_CONTRIBUTORS"].split("),")]
    assert entries and entries != [""]
    for item in entries:
        item = item if item.endswith(")") else item + ")"
        match = re.fullmatch(r"([^()]+?) \(([^()]+)\)", item)
        assert match, f"{item!r}: the index asks for 'Name (Affiliation)'"
        assert match.group(1).strip().lower() not in PLACEHOLDER_CONTRIBUTORS, f"{item!r} is a placeholder"
        assert match.group(2).strip().lower() not in PLACEHOLDER_CONTRIBUTORS, f"{item!r} is a placeholder"


def test_description_says_what_it_is_for_and_that_the_weights_are_research_only(cmake):
    text = cmake["EXTENSION_DESCRIPTION"]
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]
    assert 1 <= len(sentences) <= 2, "the index asks for 1-2 sentences"
    assert all(len(s.split()) <= MAX_SENTENCE_WORDS for s in sentences), [len(s.split()) for s in sentences]
    low = text.lower()
    assert "cardiac" in low and "segment" in low and "mri" in low
    assert "acdc" in low and "research use only" in low
    assert "not a medical device" in low
    assert not [w for w in JARGON if w in low], "a non-expert must understand the description"


def test_the_repository_name_exception_is_argued(cmake):
    """The index wants a repository name starting with "Slicer" unless the repository is also used
    without Slicer; this one is (a pip package and a command), and the README says so for the pull request."""
    name = github_repo(cmake["EXTENSION_HOMEPAGE"]).split("/")[1]
    if name.startswith("Slicer"):
        return
    readme = (INDEX_DIR / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Repository name", 1)[1].split("\n## ", 1)[0]
    assert "REPOSITORY_NAME_CHECK_EXCEPTIONS" in section and f"`{name}`" in section
    assert "pip install" in section and "`cardseg`" in section
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'cardseg = "cardseg.cli:console_main"' in pyproject  # the command exists


def test_tracked_files_fit_the_index_size_limit():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = [REPO / f for f in out.decode("utf-8").split("\0") if f]
    total = sum(f.stat().st_size for f in files if f.is_file())
    assert total < MAX_REPOSITORY_MB * 1024 * 1024, f"{total / 2**20:.1f} MB tracked"
