"""The web demo (``mmspec serve``): its calls on the bundled models, its errors, and the page
driven in headless Chromium through one generation per modality."""

from __future__ import annotations

import shutil
import socket

import pytest

from recipes.serve import COLUMNS, Demo, Models, build_app, build_parser, models_from

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# gradio's queue calls pandas options that pandas 3 deprecates (not mmspec's to fix)
pytestmark = pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword)")


@pytest.fixture(scope="module")
def demo():
    return Demo(device="cpu")


def test_image_call_returns_plain_then_each_method(demo):
    gallery, rows = demo.text_to_image("a large red circle at the top left",
                                       ["sjd", "head+lantern"], 0)
    assert [label for _, label in gallery] == ["plain", "sjd", "head+lantern"]
    assert [r[0] for r in rows] == ["plain", "sjd", "head+lantern"]
    assert len(rows[0]) == len(COLUMNS)
    assert rows[0][4] == "1.00x" and rows[1][1] > 1.0           # sjd commits several per step
    assert rows[2][1] > 1.0                                    # a relaxed head tree too
    assert rows[0][5] in ("matches", "does not match")
    _, rows = demo.text_to_image("red circle", [], 0)         # outside the shapes grammar
    assert rows[0][5] == "n/a"


def test_speech_call_runs_the_frame_head(demo):
    audio, rows = demo.speak("a red star", ["head"], 0)
    assert [r[0] for r in rows] == ["plain", "head"] and set(audio) == {"plain", "head"}
    assert rows[1][1] > 1.0                                    # frames per step


def test_answers_are_compared_with_plain_decoding(demo):
    from modalities import shapes_world as sw

    rows = demo.answer(sw.sample(20_000_001)[1], "what shape is at the right?", ["exact"])
    assert rows[1][5] == "same as plain" and rows[1][6] == rows[0][6]   # exact, greedy


@pytest.mark.parametrize("call,args,name", [
    ("text_to_image", ("  ", []), "caption"),
    ("answer", (None, "what colour?", []), "image"),
    ("speak", ("", []), "text"),
])
def test_bad_input_names_the_field(demo, call, args, name):
    with pytest.raises(ValueError, match=f"^{name}: accepted"):
        getattr(demo, call)(*args)


def test_flags_pick_models_and_drafts():
    args = build_parser().parse_args(["--t2i-model", "org/t2i", "--vlm-draft", "d"])
    m = models_from(args)
    assert m.t2i == "org/t2i" and m.t2i_draft is None         # a given model, no bundled draft
    assert m.vlm == Models().vlm and m.vlm_draft == "d" and m.bundled("vlm")
    assert not m.bundled("t2i")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def page(demo):
    if not (CHROMIUM and DRIVER):
        pytest.skip("Chromium and chromedriver could not be installed (make setup installs the "
                    "Debian packages chromium and chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    app, port = build_app(demo), _free_port()
    app.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                       quiet=True)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        yield driver
    finally:
        driver.quit()
        app.close()


def _run(driver, tab: str, button: str, table: str, wait_for: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 180)
    tabs = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "button[role=tab]"))
    next(t for t in tabs if t.text == tab).click()
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, button)).click()
    wait.until(lambda d: wait_for in d.find_element(By.CSS_SELECTOR, table).text)
    return driver.find_element(By.CSS_SELECTOR, table).text


def test_the_page_generates_each_modality_in_a_browser(page):
    from selenium.webdriver.common.by import By

    text = _run(page, "Text to image", "#t2i-run", "#t2i-table", "sjd")
    assert "tokens/step" in text and "exact" in text and "1.00x" in text
    assert len(page.find_elements(By.CSS_SELECTOR, "#t2i-images img")) == 3   # plain, exact, sjd
    text = _run(page, "Question about an image", "#vlm-run", "#vlm-table", "sjd")
    assert text.count("same as plain") >= 2                   # plain itself and exact (greedy)
    text = _run(page, "Text to speech", "#tts-run", "#tts-table", "pcg")
    assert "exact" in text and ("dB MCD" in text or "n/a" in text)
    for m in ("plain", "exact", "pcg"):                        # each player holds its audio
        assert page.find_elements(By.CSS_SELECTOR, f"#tts-{m} a[download]")


def test_concurrent_first_requests_load_each_model_once_and_all_complete():
    """Six threads, two per modality, ask a fresh demo for its pipelines at once (the page's
    concurrent first requests): every call completes, each modality loads once; a failed
    load is tried again by the next request rather than breaking the tab."""
    import threading

    fresh = Demo(device="cpu")
    got, errors = {}, []

    def ask(kind):
        try:
            got.setdefault(kind, []).append(fresh._pipe(kind))
        except Exception as e:                 # noqa: BLE001 (the test reports any failure)
            errors.append(repr(e))

    threads = [threading.Thread(target=ask, args=(k,)) for k in ("t2i", "vlm", "tts") * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(len(v) == 2 and v[0] is v[1] for v in got.values()) and len(got) == 3
    broken = Demo(device="cpu")
    broken.models.t2i = "no/such/model/folder"
    with pytest.raises(ValueError, match="no such model folder"):
        broken._pipe("t2i")
    broken.models.t2i = fresh.models.t2i
    assert broken._pipe("t2i") is not None
