"""A checkpoint's tokenizer (`tokenizer.json`, through the `tokenizers` package) and its chat
template (`jinja2`), both optional dependencies (`pip install 'nuvec-tg[models]'`).

The chat template is `chat_template.jinja`, `chat_template.json` or `tokenizer_config.json`'s
`chat_template`, rendered as transformers renders it: a sandboxed environment with
`trim_blocks` and `lstrip_blocks`, `raise_exception`, `strftime_now` and a `tojson` filter.
"""
from __future__ import annotations

import datetime
import json
import pathlib


def _require(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(f"nuvec_tg.models needs the {module!r} package for this: "
                          f"pip install 'nuvec-tg[models]' (or pip install {module})") from None


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or `{"content": ...}`."""
    if isinstance(value, dict): return value.get("content")
    return value


class Tokenizer:
    """Encoding, decoding and the chat template of the checkpoint in `directory`."""

    def __init__(self, directory: pathlib.Path):
        tokenizers = _require("tokenizers")
        path = directory / "tokenizer.json"
        if not path.exists(): raise ValueError(f"tokenizer: {directory} has no tokenizer.json")
        self.backend = tokenizers.Tokenizer.from_file(str(path))
        config_path = directory / "tokenizer_config.json"
        self.config = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.chat_template = self._find_template(directory)

    def _find_template(self, directory: pathlib.Path) -> str | None:
        if (directory / "chat_template.jinja").exists(): return (directory / "chat_template.jinja").read_text()
        if (directory / "chat_template.json").exists():
            return json.loads((directory / "chat_template.json").read_text()).get("chat_template")
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        return template

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (with the tokenizer's post-processor's special tokens unless told not)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **context) -> str:
        """The prompt text of `messages` (`[{"role": ..., "content": ...}]`) under the chat template;
        extra keyword arguments reach the template (`enable_thinking=False`, `tools=[...]`)."""
        if self.chat_template is None: raise ValueError("tokenizer: the checkpoint has no chat template")
        jinja2 = _require("jinja2")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        specials = {name: _token_text(self.config.get(name)) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                          **specials, **context)


class StreamingDecoder:
    """Text of a growing list of token ids, piece by piece: each `add` returns the text the new
    token completes (a multi-byte character split across tokens waits for its last byte)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"): return ""          # an incomplete character: wait for more
        piece, self.emitted = text[self.emitted:], len(text)
        return piece

    def finish(self) -> str:
        """Whatever is still held back."""
        text = self.tokenizer.decode(self.ids)
        piece, self.emitted = text[self.emitted:], len(text)
        return piece
