"""Checks that need no model run before any model loads (every loader is made to fail the
test, so an error line proves its check came first), each error one line with exit status 2;
Ctrl-C one line with exit status 130 and what was kept; the front doors' draft sizes bounded
by the tokens an image has and their inputs named."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from recipes.cli import Device, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VQA = os.path.join(ROOT, "samples", "prompts", "shapes_vqa.tsv")


def _boom(*args, **kwargs):
    raise AssertionError("a model was loaded before the check")


@pytest.fixture
def no_loading(monkeypatch):
    """Every front door's loader, and transformers' own, fail the test."""
    import transformers

    from modalities.image import TextToImage
    from modalities.image.continuous import ContinuousImageGenerator
    from modalities.speech import TextToSpeech
    from modalities.vlm import VisionLanguageGenerator

    for cls in (TextToImage, TextToSpeech, VisionLanguageGenerator, ContinuousImageGenerator):
        monkeypatch.setattr(cls, "from_pretrained", _boom)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(_boom))


def _line(capsys, main, argv, prog, status=2) -> str:
    """The one line ``prog`` writes to stderr for ``argv`` (exit ``status``), run as the
    console script runs it (argparse names the command after ``sys.argv[0]``)."""
    saved, sys.argv = sys.argv, [prog]
    try:
        with pytest.raises(SystemExit) as stop:
            run(lambda: main(argv), prog)
    finally:
        sys.argv = saved
    err = capsys.readouterr().err
    assert stop.value.code == status, err
    lines = [x for x in err.strip().splitlines() if "%|" not in x]      # progress bars aside
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny bundled-format image pair (a 16-id codebook, 4 x 4 tokens an image), a prompts
    file, a binary file, an image and a text-model config of 128 positions."""
    from PIL import Image
    from transformers import LlamaConfig

    from tiny_image import save_tiny_bundled_pair

    root = tmp_path_factory.mktemp("cli")
    target, draft = save_tiny_bundled_pair(str(root))
    (root / "prompts.txt").write_text("a large red circle at the top left\n"
                                      "a small blue star at the bottom\n")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    Image.new("RGB", (8, 8), "red").save(root / "red.png")
    LlamaConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                max_position_embeddings=128).save_pretrained(root / "lm")
    return dict(target=target, draft=draft, prompts=str(root / "prompts.txt"),
                binary=str(root / "binary.bin"), image=str(root / "red.png"),
                lm=str(root / "lm"), missing=str(root / "missing"), root=str(root))


TTS = os.path.join(ROOT, "samples", "models", "shapes-tts")       # 4 codebooks of 258 ids
VLM = os.path.join(ROOT, "samples", "models", "shapes-vlm")       # a text decoder of 6 layers


T2I_CASES = [
    (["--method", "tree", "--tree-depth", "1000"],
     "tree_depth=1000: accepted an integer in [1, 16] (an image has 16 tokens"),
    (["--method", "exact", "--num-draft-tokens", "100000"],
     "num_draft_tokens=100000: accepted an integer in [1, 16]"),
    (["--method", "sjd", "--window", "17"], "window=17: accepted an integer in [1, 16]"),
    (["--method", "lantern", "--k", "5000"], "k=5000: accepted an integer in [0, 15]"),
    (["--method", "tree", "--tree-branch", "17"], "tree_branch=17: accepted an integer in [1, 16]"),
    (["--top-k", "17"], "top_k=17: accepted an integer in [1, 16]"),
    (["--class-labels", "3"], "--class-labels: accepted by class-conditional models only"),
    (["--prompts-file", "{missing}"], "--prompts-file {missing}: No such file or directory"),
    (["--prompts-file", "{binary}"], "--prompts-file {binary}: not a UTF-8 text file"),
    (["--prompt", "a red elephant"], "prompt word 'elephant' is not in the model's vocabulary"),
    (["--compile"], "--compile captures CUDA graphs: accepted with a CUDA --device, not cpu"),
    (["--method", "head"], "method='head' drafts with a head"),
    (["--method", "head", "--head", "{missing}"], "--head {missing}: accepted a folder with"),
    (["--method", "sjd-max"], "method='sjd-max': accepted one of"),
    (["--device", "tpu"], "argument --device: 'tpu': accepted cpu, cuda, cuda:N or mps"),
]


@pytest.mark.parametrize("extra,line", T2I_CASES, ids=[" ".join(c[0]) for c in T2I_CASES])
def test_t2i_checks_come_before_any_model_loads(files, no_loading, capsys, extra, line):
    from recipes.text_to_image import main

    argv = ["--model", files["target"], "--draft", files["draft"], "--prompt", "a red circle",
            "--device", "cpu", *[x.format(**files) for x in extra]]
    got = _line(capsys, main, argv, "mmspec t2i")
    assert got.startswith("mmspec t2i: error: " + line.format(**files)), got


@pytest.mark.parametrize("extra,line", [
    (["--method", "exact"], "method='exact' needs a draft model"),
    (["--compile"], "--compile captures CUDA graphs"),
    (["--texts-file", "{binary}"], "--texts-file {binary}: not a UTF-8 text file"),
    (["--method", "head", "--head", "{missing}"], "--head {missing}: accepted a folder with"),
    (["--device", "cuda:7"], "argument --device: 'cuda:7': accepted"),
])
def test_tts_checks_come_before_any_model_loads(files, no_loading, capsys, extra, line):
    from recipes.tts import main

    argv = ["--model", files["missing"], "--text", "a red circle", "--device", "cpu",
            "--method", "plain", *[x.format(**files) for x in extra]]
    got = _line(capsys, main, argv, "mmspec tts")
    assert got.startswith("mmspec tts: error: " + line.format(**files)), got


@pytest.fixture
def two_codebooks(tmp_path):
    """The bundled TTS model's config files (no weights) with 2 codebooks, not 4."""
    folder = tmp_path / "tts-2"
    folder.mkdir()
    for name in ("config.json", "mmspec_speech.json"):
        with open(os.path.join(TTS, name)) as f:
            cfg = json.load(f)
        if name == "config.json":
            cfg["decoder"]["num_codebooks"] = 2
        (folder / name).write_text(json.dumps(cfg))
    return str(folder)


@pytest.mark.parametrize("extra,line", [
    (["--top-k", "259"], "top_k=259: accepted an integer in [1, 258] (a codebook has 258 ids)"),
    (["--text", "a red circle!"], "text 2 'a red circle!': characters ['!'] are outside the "
                                  "model's alphabet: accepted 'abcdefghijklmnopqrstuvwxyz .'"),
    (["--draft", "{target}"], "--draft {target}: model_type 'llama' is not a speech target"),
    (["--draft", "{two}"], "--draft {two}: 2 codebooks of 258 ids, the target 4 of 258: "
                           "accepted a draft with the target's codebooks"),
    (["--model", "{missing}"], "--model '{missing}': no such model folder"),
])
def test_tts_sizes_are_read_from_the_config_files_before_loading(files, no_loading, capsys,
                                                                 two_codebooks, extra, line):
    from recipes.tts import main

    names = dict(files, two=two_codebooks)
    argv = ["--model", TTS, "--text", "a red circle", "--device", "cpu", "--method", "plain",
            *[x.format(**names) for x in extra]]
    got = _line(capsys, main, argv, "mmspec tts")
    assert got.startswith("mmspec tts: error: " + line.format(**names)), got


@pytest.mark.parametrize("inputs,extra,line", [
    (["{missing}", "what colour?"], [], "[Errno 2] No such file or directory"),
    (["{image}", "   "], [], "the question: accepted a non-blank text"),
    (["{image}", "what colour?"], ["--max-new-tokens", "128"],
     "--max-new-tokens 128: accepted at most 127 (the target's max_position_embeddings=128"),
    (["{image}", "what colour?"], ["--method", "tree", "--draft", "{lm}", "--draft-mode",
                                   "ensemble"], "--method tree drafts trees"),
    (["{image}", "what colour?"], ["--method", "exact"], "method='exact' needs a draft model"),
    (["{image}", "what colour?"], ["--compile"], "--compile captures CUDA graphs"),
])
def test_vlm_checks_come_before_any_model_loads(files, no_loading, capsys, inputs, extra, line):
    from recipes.vlm import main

    argv = [*[x.format(**files) for x in inputs], "--target", files["lm"], "--device", "cpu",
            "--method", "plain", *[x.format(**files) for x in extra]]
    got = _line(capsys, main, argv, "mmspec vlm")
    assert got.startswith("mmspec vlm: error: " + line.format(**files)), got


def _sweep_args(files, tmp_path, *extra):
    return ["--model", files["target"], "--draft", files["draft"], "--prompts", files["prompts"],
            "--seeds", "0", "--batch", "1", "--out", str(tmp_path / "out"), *extra]


@pytest.mark.parametrize("extra,line", [
    (["--methods", "plain,tree", "--param", "tree.tree_depth=17"],
     "tree_depth=17: accepted an integer in [1, 16]"),
    (["--methods", "plain,lantern", "--param", "lantern.k=5000"], "k=5000: accepted an integer"),
    (["--prompts", "{binary}"], "--prompts {binary}: not a UTF-8 text file"),
    (["--device", "tpu"], "argument --device: 'tpu': accepted"),
])
def test_eval_checks_come_before_any_model_loads(files, no_loading, capsys, tmp_path, extra,
                                                 line):
    from eval.sweep import main

    argv = _sweep_args(files, tmp_path, *[x.format(**files) for x in extra])
    got = _line(capsys, main, argv, "mmspec eval")
    assert got.startswith("mmspec eval: error: " + line.format(**files)), got
    assert not (tmp_path / "out").exists()


def test_eval_checks_config_values_and_vlm_prompt_lines_before_loading(files, no_loading,
                                                                       capsys, tmp_path):
    from eval.sweep import main

    cfg = tmp_path / "sweep.yaml"
    cfg.write_text("modality: video\ndevice: tpu\n")
    got = _line(capsys, main, ["--config", str(cfg)], "mmspec eval")
    assert got.startswith("mmspec eval: error: --modality 'video': accepted one of image"), got
    cfg.write_text("device: tpu\n")
    got = _line(capsys, main, ["--config", str(cfg)], "mmspec eval")
    assert got.startswith("mmspec eval: error: --device 'tpu': accepted cpu"), got
    lines = tmp_path / "vqa.tsv"
    lines.write_text(f"{files['missing']}\twhat colour?\n")
    got = _line(capsys, main, ["--modality", "vlm", "--prompts", str(lines), "--methods",
                               "plain", "--out", str(tmp_path / "o")], "mmspec eval")
    assert f"image {files['missing']!r}: accepted a shapes-world seed or an existing" in got
    got = _line(capsys, main, _sweep_args(files, tmp_path, "--draft", "", "--methods",
                                          "plain,exact"), "mmspec eval")
    assert "method='exact' needs a draft model" in got


def test_eval_refuses_an_out_made_with_other_options_before_loading(files, no_loading, capsys,
                                                                    tmp_path):
    from eval.sweep import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text("{}\n")
    (out / "run.json").write_text(json.dumps({"batch": 8}))
    got = _line(capsys, main, _sweep_args(files, tmp_path, "--methods", "plain"), "mmspec eval")
    assert got.startswith(f"mmspec eval: error: --out {out}: its rows were made with other "
                          "options ("), got
    assert "batch 8 -> 1" in got


def test_a_stopped_sweep_says_in_one_line_which_rows_it_kept(files, monkeypatch, capsys,
                                                             tmp_path):
    """Ctrl-C after the first unit: exit 130, no traceback, the rows on disk named; the same
    command runs the units left."""
    import eval.sweep as sweep
    from eval.tasks import ImageTask

    calls = []

    def unit(task, u, prompts, batch, profile):
        calls.append(u)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return [dict(key=sweep.unit_key(u), prompt_index=u["chunk"])]

    monkeypatch.setattr(sweep, "run_unit", unit)
    monkeypatch.setattr(ImageTask, "__init__", _fake_task_init)
    argv = _sweep_args(files, tmp_path, "--methods", "plain", "--no-report")
    got = _line(capsys, sweep.main, argv, "mmspec eval", status=130)
    kept = tmp_path / "out" / "results.jsonl"
    assert got == f"mmspec eval: interrupted: 1 rows kept in {kept}; the same command runs " \
                  "the units left", got
    assert len(calls) == 2


def _fake_task_init(self, model=None, draft=None, device=None, head=None, **gen):
    """An image task that loads nothing (the sweep's units are replaced in the test)."""
    self.model_path, self.draft_path, self.head_path = model, draft, head
    self.has_draft, self.has_head, self.dtype, self.device = draft is not None, False, "x", "cpu"


def _recipe_args(files, tmp_path, *extra):
    return ["--modality", "t2i", "--target", files["target"], "--out", str(tmp_path / "head"),
            "--device", "cpu", "--samples", "2", "--eval", "1", *extra]


@pytest.mark.parametrize("extra,line", [
    (["--data", "{binary}"], "--data {binary}: not a UTF-8 text file"),
    (["--compare-head", "{missing}"], "--compare-head {missing}: accepted a folder with"),
    (["--measure-only"], "--measure-only: "),
    (["--device", "cuda"], "argument --device: 'cuda': accepted"),
    (["--modality", "vlm", "--data", "{prompts}"], "--data {prompts} line 1: accepted "
                                                   "IMAGE<TAB>QUESTION[<TAB>ANSWER]"),
])
def test_draft_head_recipe_checks_come_before_any_model_loads(files, no_loading, capsys,
                                                               tmp_path, extra, line):
    if "cuda" in extra and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from recipes.train.draft_head import main

    argv = _recipe_args(files, tmp_path, *[x.format(**files) for x in extra])
    got = _line(capsys, main, argv, "recipes.train.draft_head")
    assert got.startswith("recipes.train.draft_head: error: " + line.format(**files)), got


# the tiny target: 1 layer, an output head of 27 + len(WORDS) + 16 ids
@pytest.mark.parametrize("extra,line", [
    (["--feature-layers", "2"], "--feature-layers 2: accepted indices in [0, 1] (the target's "
                                "config: num_hidden_layers=1; 0 the embeddings"),
    (["--arch", "eagle3", "--feature-layers", "0", "1"],
     "--feature-layers 0 1: feature layer 1 (the last layer's output): vLLM's id 1 is taken "
     "before the final norm"),
    (["--arch", "eagle3"], "a target of 1 layers: the field's default layers"),
    (["--draft-vocab", "{vocab}"], "--draft-vocab {vocab}: accepted an integer in [1, {below}] "
                                   "(fewer ids than the target's {vocab} output ids"),
    (["--arch", "eagle3", "--feature-layers", "0", "--draft-vocab", "{above}"],
     "--draft-vocab {above}: accepted an integer in [1, {vocab}] (at most"),
    (["--target", "{missing}"], "--target '{missing}': no such model folder"),
    (["--modality", "vlm", "--target", VLM, "--feature-layers", "7"],
     "--feature-layers 7: accepted indices in [0, 6] (the target's config: num_hidden_layers=6"),
    (["--modality", "vlm", "--target", VLM, "--draft-vocab", "52"],
     "--draft-vocab 52: accepted an integer in [1, 51]"),
    (["--modality", "tts", "--target", TTS, "--draft-vocab", "10"],
     "--draft-vocab 10: a frame head drafts over the codebooks' whole vocabulary"),
    (["--modality", "tts", "--target", TTS, "--arch", "eagle3"],
     "--arch eagle3: an EAGLE-3 head drafts from one token table"),
    (["--modality", "tts", "--target", TTS, "--feature-layers", "6"],
     "--feature-layers 6: accepted indices in [0, 5]"),
])
def test_draft_head_recipe_checks_sizes_against_the_targets_config_before_loading(
        files, no_loading, capsys, tmp_path, extra, line):
    from recipes.train.draft_head import main
    from recipes.train.t2i import WORD_OFFSET, WORDS

    vocab = WORD_OFFSET + len(WORDS) + 16
    names = dict(files, vocab=vocab, below=vocab - 1, above=vocab + 1)
    argv = _recipe_args(files, tmp_path, "--data", files["prompts"],
                        *[x.format(**names) for x in extra])
    got = _line(capsys, main, argv, "recipes.train.draft_head")
    assert got.startswith("recipes.train.draft_head: error: " + line.format(**names)), got
    assert not (tmp_path / "head").exists()


@pytest.mark.parametrize("extra,line", [
    (["--t2i-model", "{missing}"], "--t2i-model {missing}: no such folder: accepted a model "
                                   "folder holding config.json, or a Hugging Face id"),
    (["--vlm-draft", "{root}"], "--vlm-draft {root}: holds no config.json"),
    (["--tts-model", "{lm}", "--tts-draft", "{missing}"], "--tts-draft {missing}: no such folder"),
    (["--tts-head", "{missing}"], "--tts-head {missing}: accepted a folder with config.json"),
])
def test_serve_checks_model_folders_before_the_server_starts(files, no_loading, monkeypatch,
                                                             capsys, extra, line):
    import recipes.serve as serve

    monkeypatch.setattr(serve, "build_app", _boom)
    argv = ["--device", "cpu", *[x.format(**files) for x in extra]]
    got = _line(capsys, serve.main, argv, "mmspec serve")
    assert got.startswith("mmspec serve: error: " + line.format(**files)), got


def test_draft_head_recipe_reads_the_question_file_eval_reads(files, tmp_path):
    """samples/prompts/shapes_vqa.tsv (seed, question, answer): scenes rendered, questions
    asked; the held-out items are the file's last."""
    from PIL import Image

    from recipes.train import draft_head as recipe

    args = recipe.build_parser().parse_args(
        ["--modality", "vlm", "--target", files["lm"], "--out", str(tmp_path), "--data", VQA,
         "--samples", "2", "--eval", "1"])
    train, held = recipe.load_items(args)
    with open(VQA) as f:
        last = f.read().strip().splitlines()[-1].split("\t")
    assert len(train) == 2 and len(held) == 1
    image, messages = held[0]
    assert isinstance(image, Image.Image)
    assert messages[0]["content"][1]["text"] == last[1]


def test_a_stopped_recipe_says_in_one_line_what_it_kept(files, monkeypatch, capsys, tmp_path):
    from recipes.train import draft_head as recipe

    out = tmp_path / "head"

    def stopped(args, items):
        (out / "checkpoint").mkdir(parents=True)
        (out / "checkpoint" / "trainer.json").write_text(json.dumps({"step": 5}))
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "_run", stopped)
    got = _line(capsys, recipe.main, _recipe_args(files, tmp_path, "--data", files["prompts"]),
                "recipes.train.draft_head", status=130)
    assert got == f"recipes.train.draft_head: interrupted: {out}/checkpoint holds step 5 " \
                  "(--resume continues from it)"


def test_a_recipe_stopped_while_writing_its_checkpoint_still_says_one_line(files, monkeypatch,
                                                                          capsys, tmp_path):
    from recipes.train import draft_head as recipe

    out = tmp_path / "head"

    def stopped(args, items):
        (out / "checkpoint").mkdir(parents=True)
        (out / "checkpoint" / "trainer.json").write_text('{"step": 5, "seco')   # cut short
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "_run", stopped)
    got = _line(capsys, recipe.main, _recipe_args(files, tmp_path, "--data", files["prompts"]),
                "recipes.train.draft_head", status=130)
    assert got == f"recipes.train.draft_head: interrupted: {out}/checkpoint was being written " \
                  "when stopped (its trainer.json is not whole): --resume cannot continue " \
                  "from it, a run without it starts again"


def test_checkpoint_state_is_written_whole(tmp_path):
    from recipes.train import draft_head as recipe

    class Head:
        def save_pretrained(self, path):
            os.makedirs(path, exist_ok=True)

    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones(2)
    opt.step()
    recipe.save_checkpoint(Head(), opt, 7, str(tmp_path), seconds=1.5)
    assert sorted(os.listdir(tmp_path / "checkpoint")) == ["optimizer.safetensors",
                                                           "trainer.json"]
    assert recipe.checkpoint_seconds(str(tmp_path)) == 1.5


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(capsys):
    def stopped():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        run(stopped, "mmspec t2i")
    assert stop.value.code == 130 and capsys.readouterr().err == "mmspec t2i: interrupted\n"


def test_ctrl_c_while_the_console_imports_a_command_is_one_line(monkeypatch, capsys):
    import mmspec_cli

    def stopped(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(mmspec_cli.importlib, "import_module", stopped)
    with pytest.raises(SystemExit) as stop:
        mmspec_cli.main(["eval"])
    assert stop.value.code == 130 and capsys.readouterr().err == "mmspec eval: interrupted\n"


def test_device_strings_are_checked_against_the_machine():
    import argparse

    assert Device()("cpu") == "cpu" and Device()(" cpu:0 ") == "cpu:0"
    for bad in ("tpu", "cuda:x", "gpu", "cuda: 0", f"cuda:{torch.cuda.device_count()}"):
        with pytest.raises(argparse.ArgumentTypeError, match="accepted cpu, cuda, cuda:N or mps"):
            Device()(bad)
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        Device()("tpu")
    assert str(refused.value).endswith("; 'tpu' is not a torch device")
    assert "(this machine has: cpu" in str(refused.value)


def test_devices_torch_takes_are_refused_only_where_the_machine_lacks_them(monkeypatch):
    import argparse

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda:0"):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            Device()(name)
        assert "\n" not in str(refused.value)
        assert str(refused.value) == (f"{name!r}: accepted cpu, cuda, cuda:N or mps, where the "
                                      "machine has them (this machine has: cpu"
                                      + ", mps" * torch.backends.mps.is_available()
                                      + "); this machine has no CUDA device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert Device()("cuda:1") == "cuda:1" and Device()("cuda") == "cuda"
    with pytest.raises(argparse.ArgumentTypeError, match="this machine has 2 CUDA devices$"):
        Device()("cuda:2")
    if not torch.backends.mps.is_available():
        with pytest.raises(argparse.ArgumentTypeError, match="has no MPS device$"):
            Device()("mps:0")
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
        assert Device()("xpu") == "xpu"
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
        with pytest.raises(argparse.ArgumentTypeError, match="has no xpu device$"):
            Device()("xpu")


# -- the Python front doors -------------------------------------------------------------------

def test_t2i_draft_sizes_are_bounded_by_the_images_tokens(files):
    from modalities.image import TextToImage

    pipe = TextToImage.from_pretrained(files["target"], draft=files["draft"])
    for method, params in (("tree", dict(tree_depth=1000)), ("exact", dict(num_draft_tokens=17)),
                           ("sjd", dict(window=10**6))):
        name, value = next(iter(params.items()))
        with pytest.raises(ValueError, match=rf"{name}={value}: accepted an integer in \[1, 16\] "
                                             r"\(an image has 16 tokens"):
            pipe("a red circle", method=method, progress=False, **params)
    out = pipe("a red circle", method="tree", tree_depth=16, tree_width=1, tree_branch=1,
               progress=False, seed=0)
    assert out.tokens.shape == (1, 16)
    with pytest.raises(ValueError, match=r"negative_prompt 0: 5: accepted a string or a list"):
        pipe("a red circle", negative_prompt=5, progress=False)


def test_continuous_prompts_are_named():
    from modalities.image.continuous import ContinuousImageGenerator
    from modalities.image.continuous.pipeline import WordIds
    from tiny_continuous import tiny_continuous

    gen = ContinuousImageGenerator(tiny_continuous(), tiny_continuous(seed=1),
                                   tokenizer=WordIds(["a", "red", "circle"]))
    for bad in (123, [1.5], ["a", 5]):
        with pytest.raises(ValueError, match=r"prompts=.*: accepted a string or a list of "
                                             "strings"):
            gen(prompts=bad)
    for bad in (123, [1.5], ["a", 5]):
        with pytest.raises(ValueError, match=r"prompt_ids=.*: accepted lists of conditioning"):
            gen(prompt_ids=bad)
    assert gen(prompt_ids=torch.tensor([[1, 2]]), seed=0).latents.shape[0] == 1


def test_tts_texts_and_descriptions_are_named():
    from modalities.speech import DelayPatternAdapter, EncodecCodec, TextToSpeech
    from modalities.speech.bundled import CharTokenizer
    from tiny_speech import tiny_musicgen

    model = tiny_musicgen()
    adapter = DelayPatternAdapter(model, EncodecCodec(model.audio_encoder),
                                  CharTokenizer("abcdefghijklmnopqrstuvwxyz "))
    tts = TextToSpeech(adapter)
    for bad, where in (([1.5], "text 0: 1.5"), (["a red circle", 5], "text 1: 5"),
                       ([[1.5]], r"text 0: \[1.5\]")):
        with pytest.raises(ValueError, match=rf"{where}: accepted a string or a list of token"):
            tts(bad, progress=False, max_frames=2)
    with pytest.raises(ValueError, match=r"description=123: accepted a non-blank string"):
        tts("a red circle", description=123, progress=False, max_frames=2)
    with pytest.raises(ValueError, match=r"description='speaker 7': refused by the model's text "
                                         r"encoder \(.*\['7'\]"):
        tts("a red circle", description="speaker 7", progress=False, max_frames=2)


def test_a_draft_head_folder_given_as_an_mtp_checkpoint_is_named(tmp_path):
    from tiny_vlm import tiny_qwen_vl

    from mmspec.drafters import DraftHead, MtpHead

    target = tiny_qwen_vl("qwen3.5")
    DraftHead.for_target(target).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"holds no mtp\.\* tensors \(no native MTP module; it "
                                         r"holds a draft head: pass the folder as head= "
                                         r"\(--head on the command line\)"):
        MtpHead.from_checkpoint(tmp_path, target)
