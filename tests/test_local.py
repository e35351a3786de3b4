"""Loading a local model (adafuse/models/local.py): typed errors for unknown, gated and remote-code models (offline),
and the end and banned tokens of the bundled pair."""
import httpx
import pytest
import transformers

import adafuse.models.local as loading
from adafuse import ModelLoadError, ModelNotFoundError, load_model


def test_loader_errors_are_typed(tmp_path):
    with pytest.raises(ModelNotFoundError, match="bundled name"):
        load_model("no-such-model")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path))


def _gated_error(name: str) -> OSError:
    """What transformers raises for a gated repository: huggingface_hub's GatedRepoError wrapped in an OSError."""
    from huggingface_hub.errors import GatedRepoError
    url = f"https://huggingface.co/{name}/resolve/main/config.json"
    response = httpx.Response(403, request=httpx.Request("GET", url))
    try:
        raise GatedRepoError(f"403 Client Error. Cannot access gated repo for url {url}.", response=response)
    except GatedRepoError as exc:
        try:
            raise OSError(f"You are trying to access a gated repo.\nMake sure to have access to it at "
                          f"https://huggingface.co/{name}.\n{exc}") from exc
        except OSError as wrapped:
            return wrapped


def _patch_loader(monkeypatch, error):
    """AutoTokenizer.from_pretrained (the first Hub call of a load) fails like transformers does: not in the local
    cache first, then `error` from the Hub."""
    def from_pretrained(cls, name, **kw):
        if kw.get("local_files_only") and not isinstance(error, ValueError):
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                          "in the cached files.")
        raise error(name) if callable(error) else error
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(from_pretrained))
    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: True)


@pytest.mark.parametrize("error", [_gated_error, lambda n: _gated_error(n).__cause__,
                                   lambda n: OSError(f"401 Client Error: Access to model {n} is restricted.")])
def test_a_gated_model_says_how_to_get_access(monkeypatch, error):
    _patch_loader(monkeypatch, error)
    name = "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(ModelLoadError) as err:
        loading.load_model(name, "cpu")
    msg = str(err.value)
    assert "gated" in msg and f"https://huggingface.co/{name}" in msg and "HF_TOKEN" in msg and "hf auth login" in msg


def test_a_remote_code_model_says_how_to_allow_it(monkeypatch):
    name = "internlm/internlm3-8b-instruct"
    _patch_loader(monkeypatch, ValueError(
        f"The repository {name} contains custom code which must be executed to correctly load the model. You can "
        f"inspect the repository content at https://hf.co/{name} .\nPlease pass the argument `trust_remote_code=True` "
        "to allow custom code to be run."))
    with pytest.raises(ModelLoadError) as err:
        loading.load_model(name, "cpu")
    msg = str(err.value)
    assert all(s in msg for s in ("remote code", "trust_remote_code=True", "--trust-remote-code",
                                  '"Trust remote code"', "runs with your permissions"))


def test_end_tokens_are_eos_and_end_of_turn_only(pair):
    sm, gm = pair
    assert sm.end_ids == {sm.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    assert gm.end_ids == {gm.tokenizer.eos_token_id} and len(gm.end_ids) < 5
    for special in ("<unused0>", "<bos>", "<start_of_turn>"):  # control tokens: never proposed, never an end
        assert gm.tokenizer.convert_tokens_to_ids(special) in gm.banned_ids
    # the GGUF's user-defined markers, not marked special, are control tokens too (a bare raw question looped on
    # them); added tokens that read as text stay
    for marker in ("<start_of_image>", "<end_of_image>", "[multimodal]"):
        assert gm.tokenizer.convert_tokens_to_ids(marker) in gm.banned_ids
    for text in ("<table>", "</td>", "\n\n"):
        assert gm.tokenizer.convert_tokens_to_ids(text) not in gm.banned_ids
