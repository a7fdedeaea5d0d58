"""The SFT dataset: (prompt, response) pairs, or whole conversations whose assistant turns are trained."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tandem.batch import Batch
from tandem.data.images import row_images, widen_images
from tandem.data.padding import pad_sequences, position_ids_from_mask
from tandem.data.rows import (
    DataError,
    FileList,
    as_paths,
    check_prompt,
    check_row,
    iter_rows,
    render_prompt,
    require,
    resolve_mode,
    tokenize,
)
from tandem.models.chat_template import render_chat
from tandem.models.model_type import IMAGE_PLACEHOLDER

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "right")
LOSS_MASKS = ("turn", "stop")  # data.sft_loss_mask: which tokens of an assistant turn are trained
MAX_LOGGED_ROWS = 3  # filtered / truncated rows named in the log, as examples
SAMPLE_ROWS = 8  # rendered rows kept (`sample_texts`) for the start-up tokenizer round-trip check

Piece = tuple[str, int]  # (text, 1 if the loss covers its tokens else 0)
Render = Callable[..., str]  # (messages, generation_prompt=...) -> the chat template's text


class SFTDataset:
    """SFT rows as ``input_ids`` and ``loss_mask`` token lists, aligned (the loss shifts the mask
    with the labels). A row is one of two kinds:

    - a conversation, when it has a non-null ``messages_key`` field (``messages_key=None``: never):
      system / user / assistant / tool messages rendered whole by the chat template (with ``tools``,
      OpenAI-style schemas, when given, and ``chat_template_kwargs``, the template's own variables,
      as every rendering of a pair and of the RL prompts gets them). ``loss_mask`` is 1 on each
      assistant message's turn after the generation prompt, 0 on the turn headers and every other
      message; ``loss_mask="turn"`` (verl's MultiTurnSFTDataset) trains the whole turn as the template renders it, its text after
      the stop token included (``<|im_end|>\n``); ``"stop"`` trains the content and the token that
      ends the turn (the first of ``stop_token_ids`` after the content; default: EOS), where the
      rollout stops the model, and nothing after it. The last message must be the assistant's.
      Found by rendering growing prefixes of the conversation, which must each start with the one
      before (a prefix-stable template), and checked: the pieces' tokens together equal the tokens
      of the whole rendering.
    - a (prompt, response) pair otherwise: prompt tokens (rendered with the generation prompt, as
      :class:`PromptDataset` does, ``tools`` included) + response tokens + EOS, prompt and response
      tokenized separately so the response tokens are the ones the policy would generate after that
      prompt; ``loss_mask`` is 1 on the response tokens and the EOS.

    A vision-language model's rows may carry images (``image_key``, verl's schema, see
    tandem/data/images.py: an ``<image>`` in the prompt's or the conversation's non-assistant messages per
    image; ``processor`` widens each to its tokens, counted in ``max_length``, never trained): their items
    hold ``multi_modal_inputs`` (the images' processor outputs; None on rows without images) for the
    trainer.

    Sequences longer than ``max_length``: ``truncation="error"`` raises; ``"right"`` cuts the end,
    and drops (counted in ``report["filtered"]``) rows with no trained token left; both are logged
    as a warning that names a few of the rows. ``sample_texts`` are (location, text) of the first
    rows: the rendered prompt followed by the response, or the rendered conversation.
    """

    def __init__(
        self,
        files: FileList,
        tokenizer: Any,
        *,
        max_length: int,
        prompt_key: str = "prompt",
        response_key: str = "response",
        prompt_dict_keys: Sequence[str] = (),
        response_dict_keys: Sequence[str] = (),
        messages_key: str | None = "messages",
        truncation: str = "error",
        chat_template: str = "auto",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: list[dict] | None = None,
        stop_token_ids: Sequence[int] | None = None,
        processor: Any = None,
        image_key: str = "images",
        loss_mask: str = "stop",
    ) -> None:
        if loss_mask not in LOSS_MASKS:
            raise ValueError(f"data.sft_loss_mask must be one of {LOSS_MASKS}, got {loss_mask!r}")
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation must be one of {TRUNCATION_MODES} for SFT, got {truncation!r}")
        if max_length < 2:
            raise ValueError(f"data.max_length must be >= 2, got {max_length}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token; SFT appends one to every response")
        stop_ids = _check_stop_ids(tokenizer, stop_token_ids)
        mode = resolve_mode(chat_template, tokenizer, chat_template_kwargs)
        render = functools.partial(render_chat, tokenizer, tools=tools, template_kwargs=chat_template_kwargs)
        self.files = as_paths(files)
        self.max_length = max_length

        # Per row: its location, its pieces, and for a conversation its whole rendering (the
        # pieces' tokens are checked against it); a pair's EOS is added after tokenizing.
        rows: list[tuple[str, list[Piece], str | None]] = []
        images: dict[int, list[Any]] = {}  # row -> its decoded images
        for path in self.files:
            for location, row in iter_rows(path):
                row = check_row(location, row)
                if messages_key is not None and row.get(messages_key) is not None:
                    if mode != "chat":
                        raise DataError(
                            f"{location}: field {messages_key!r} holds a conversation, which needs the "
                            f"tokenizer's chat template (data.chat_template={chat_template} resolves to "
                            f"{mode}); use a tokenizer with a chat template and data.chat_template=auto"
                        )
                    messages = check_prompt(location, row[messages_key], messages_key, mode)
                    if row.get(image_key) is not None:
                        _check_replies_hold_no_image(location, messages, messages_key)
                        messages, images[len(rows)] = row_images(
                            location, messages, row[image_key], image_key, path.parent, mode, processor
                        )
                    pieces, whole = _conversation_pieces(
                        location, messages, messages_key, render, stop_ids if loss_mask == "stop" else None
                    )
                    rows.append((location, pieces, whole))
                    continue
                prompt = _field(location, row, prompt_key, prompt_dict_keys, object, "prompt")
                if isinstance(prompt, str) and mode != "none":  # verl's SFT: plain text is the user's message
                    prompt = [{"role": "user", "content": prompt}]
                messages = check_prompt(location, prompt, prompt_key, mode)
                if row.get(image_key) is not None:
                    messages, images[len(rows)] = row_images(
                        location, messages, row[image_key], image_key, path.parent, mode, processor
                    )
                prompt_text = render_prompt(
                    messages, tokenizer, mode, location, tools=tools, template_kwargs=chat_template_kwargs
                )
                response = _field(location, row, response_key, response_dict_keys, str, "response")
                rows.append((location, [(prompt_text, 0), (response, 1)], None))

        self.sample_texts: list[tuple[str, str]] = [
            (location, "".join(text for text, _ in pieces)) for location, pieces, _ in rows[:SAMPLE_ROWS]
        ]
        texts = [text for _, pieces, _ in rows for text, _ in pieces]
        texts += [whole for _, _, whole in rows if whole is not None]
        all_ids = iter(tokenize(tokenizer, texts))
        pieces_ids = [[next(all_ids) for _ in pieces] for _, pieces, _ in rows]
        whole_ids = {i: next(all_ids) for i, (_, _, whole) in enumerate(rows) if whole is not None}

        self._items: list[dict[str, Any]] = []
        filtered: list[str] = []
        truncated: list[str] = []
        eos = tokenizer.eos_token_id
        for i, ((location, pieces, whole), ids_of_pieces) in enumerate(zip(rows, pieces_ids)):
            if whole is not None:
                _check_conversation_ids(
                    location,
                    pieces,
                    ids_of_pieces,
                    whole_ids[i],
                    stop_ids if loss_mask == "stop" else None,
                    tokenizer,
                )
            image_inputs = None
            if images.get(i):  # the text as the model reads it: each image widened to its tokens
                ids_of_pieces, image_inputs = _widen_pieces(pieces, ids_of_pieces, images[i], processor)
            input_ids = [token for ids in ids_of_pieces for token in ids]
            loss_mask = [trained for (_, trained), ids in zip(pieces, ids_of_pieces) for _ in ids]
            if whole is None:
                input_ids.append(eos)
                loss_mask.append(1)
                what = "prompt + response + EOS"
            else:
                what = "the conversation"
            if len(input_ids) > max_length:
                if truncation == "error":
                    raise DataError(
                        f"{location}: {what} is {len(input_ids)} tokens, longer than "
                        f"data.max_length={max_length}; raise data.max_length or set data.truncation=right"
                    )
                first_trained = loss_mask.index(1)
                if first_trained >= max_length:
                    filtered.append(f"{location} (prompt alone {first_trained} tokens)")
                    continue
                truncated.append(f"{location} ({len(input_ids)} tokens)")
                input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
            item = {"input_ids": input_ids, "loss_mask": loss_mask}
            if processor is not None:
                item["multi_modal_inputs"] = image_inputs
            self._items.append(item)

        total = len(rows)
        self.report = {
            "total": total,
            "kept": len(self._items),
            "filtered": len(filtered),
            "truncated": len(truncated),
        }
        summary = (
            f"SFT rows from {len(self.files)} file(s): {total} rows, {len(self._items)} kept, "
            f"{len(filtered)} filtered, {len(truncated)} truncated "
            f"(data.max_length={max_length}, data.truncation={truncation})"
        )
        changed = filtered or truncated
        if changed:
            summary += f"; e.g. {', '.join(changed[:MAX_LOGGED_ROWS])}"
        logger.log(logging.WARNING if changed else logging.INFO, "%s", summary)
        if not self._items:
            raise DataError(
                f"no SFT rows left out of {total} in {', '.join(map(str, self.files))}: every prompt fills "
                f"data.max_length={max_length}; raise it"
            )

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._items[i]


def collate_sft(items: Sequence[dict[str, Any]], pad_token_id: int) -> Batch:
    """Items of an :class:`SFTDataset` as a Batch: RIGHT-padded ``input_ids``, ``attention_mask``,
    ``position_ids`` and ``loss_mask`` (0 on padding), each [N, longest]; a vision-language model's
    items add ``multi_modal_inputs``, a column of objects."""
    if not items:
        raise ValueError("collate_sft got no items")
    input_ids = pad_sequences([item["input_ids"] for item in items], pad_token_id, side="right")
    attention_mask = pad_sequences([[1] * len(item["input_ids"]) for item in items], 0, side="right")
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "loss_mask": pad_sequences([item["loss_mask"] for item in items], 0, side="right"),
    }
    if "multi_modal_inputs" in items[0]:
        return Batch.from_dict(
            tensors, {"multi_modal_inputs": [item["multi_modal_inputs"] for item in items]}
        )
    return Batch.from_dict(tensors)


def _field(
    location: str, row: dict[str, Any], key: str, dict_keys: Sequence[str], kind: type, what: str
) -> Any:
    """row[key], then [k] for each of `dict_keys` (data.prompt_dict_keys / response_dict_keys)."""
    hint = f" Set data.{what}_key if it has another name."
    if not dict_keys:
        return require(location, row, key, kind, hint)
    value, path = require(location, row, key, dict, hint), key
    for i, inner in enumerate(dict_keys):
        last = i == len(dict_keys) - 1
        value = require(
            location, value, inner, kind if last else dict, f" (in field {path!r}: data.{what}_dict_keys)"
        )
        path = f"{path}.{inner}"
    return value


def _check_replies_hold_no_image(location: str, messages: list[dict[str, Any]], key: str) -> None:
    for i, message in enumerate(messages):
        if message["role"] == "assistant" and IMAGE_PLACEHOLDER in message["content"]:
            raise DataError(
                f"{location}: field {key!r} message {i} is the assistant's and holds {IMAGE_PLACEHOLDER}; images go "
                f"in the messages the model reads (user, system, tool), not in the replies SFT trains"
            )


def _widen_pieces(
    pieces: list[Piece], ids_of_pieces: list[list[int]], images: list[Any], processor: Any
) -> tuple[list[list[int]], dict[str, Any]]:
    """The pieces' ids with each image widened to its tokens in the piece that holds its marker (never a
    trained piece: replies hold no image), and the images' inputs in order."""
    widened, inputs, used = [], [], 0
    for (text, _), ids in zip(pieces, ids_of_pieces):
        count = text.count(processor.image_token)
        if count:
            ids, piece_inputs = widen_images(text, images[used : used + count], processor)
            inputs.append(piece_inputs)
            used += count
        widened.append(ids)
    if used != len(images):
        raise ValueError(f"the rendered text holds {used} image markers for {len(images)} images")
    return widened, {
        key: torch.cat([piece[key] for piece in inputs]) for key in ("pixel_values", "image_grid_thw")
    }


def _check_stop_ids(tokenizer: Any, stop_token_ids: Sequence[int] | None) -> dict[int, str]:
    """Stop id -> its token's text (what a rendering holds), EOS when none are given."""
    ids = [tokenizer.eos_token_id] if stop_token_ids is None else [int(t) for t in stop_token_ids]
    if not ids:
        raise ValueError("stop_token_ids is empty; give the ids that end an assistant turn (e.g. EOS)")
    stops = {}
    for token_id in ids:
        token = tokenizer.convert_ids_to_tokens(token_id) if 0 <= token_id < len(tokenizer) else None
        if not token:
            raise ValueError(f"stop_token_ids: {token_id} is not a token id of this tokenizer")
        stops[token_id] = token
    return stops


def _render(location: str, key: str, render: Render, messages: list, upto: int, *, gen: bool) -> str:
    try:
        return render(messages[:upto], generation_prompt=gen)
    except Exception as e:  # jinja templates raise their own errors ("roles must alternate", ...)
        raise DataError(
            f"{location}: the tokenizer's chat template fails on field {key!r} up to message {upto - 1} "
            f"({type(e).__name__}: {e}); fix the messages"
        ) from e


def _conversation_pieces(
    location: str,
    messages: list[dict[str, Any]],
    key: str,
    render: Render,
    stops: dict[int, str] | None,
) -> tuple[list[Piece], str]:
    """The conversation's rendering cut into (text, trained) pieces, and the whole rendering; ``render`` is
    the run's chat rendering (models/chat_template.py's render_chat with its tools and template arguments).

    For each assistant message i, the rendering of messages[:i] with the generation prompt ends
    where its content starts, and its turn is trained to the end of the rendering of messages[:i+1]
    (`stops` None), or up to the first stop token after the content there."""
    last = messages[-1]["role"]
    if last != "assistant":
        raise DataError(
            f"{location}: field {key!r} must end with an assistant message, the last one is {last!r}; "
            f"SFT trains the assistant turns, and text after the last of them teaches nothing"
        )
    pieces: list[Piece] = []
    done = ""  # the rendering cut into pieces so far
    previous = ""  # the last rendering, which the next one must start with
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(location, key, render, messages, i, gen=True)
        after = _render(location, key, render, messages, i + 1, gen=False)
        for text, upto in ((before, i), (after, i + 1)):
            if not text.startswith(previous):
                if stops is not None:  # e.g. Qwen3's: cut out of the whole rendering instead
                    return _pieces_of_whole(location, messages, key, render, stops)
                raise DataError(
                    f"{location}: field {key!r} message {i}: the chat template is not prefix-stable: its "
                    f"rendering of messages[:{upto}] does not start with the rendering of the messages before "
                    f"it, so the assistant turns cannot be cut out of the whole as they render; set "
                    f"data.sft_loss_mask=stop (each turn trained as the whole conversation renders it), or use a "
                    f"template that renders a conversation as the rendering of its beginning followed by the rest"
                )
            previous = text
        turn = after[len(before) :]
        if stops is None:  # the whole turn, as verl's MultiTurnSFTDataset trains it
            pieces += [(before[len(done) :], 0), (turn, 1)]
            done = after
            continue
        content = message["content"]
        content_end = turn.find(content) + len(content) if content in turn else 0
        ends = [(turn.find(stop, content_end), stop) for stop in stops.values() if stop in turn[content_end:]]
        if not ends:
            raise DataError(
                f"{location}: field {key!r} message {i}: the chat template does not end assistant turns with "
                f"a stop token of the model ({', '.join(map(repr, stops.values()))}: generation_config.json's "
                f"eos_token_id and the tokenizer's EOS); it renders the turn as {turn!r}. Set "
                f"data.sft_loss_mask=turn to train the whole turn as the template renders it (verl's way), or "
                f"add the token that ends its turns to generation_config.json's eos_token_id (the rollout "
                f"stops there too)"
            )
        position, stop = min(ends)
        cut = len(before) + position + len(stop)
        pieces += [(before[len(done) :], 0), (after[len(before) : cut], 1)]
        done = after[:cut]
    if previous[len(done) :]:
        pieces.append((previous[len(done) :], 0))
    return [piece for piece in pieces if piece[0]], previous


def _pieces_of_whole(
    location: str, messages: list[dict[str, Any]], key: str, render: Render, stops: dict[int, str]
) -> tuple[list[Piece], str]:
    """`_conversation_pieces` for a template that renders an earlier assistant turn otherwise once later messages
    follow: Qwen3's drops the think block of the turns before the last user message (with enable_thinking=false
    the generation prompt holds an empty one, so no growing rendering starts with the one before). The pieces
    are cut out of the whole conversation's rendering, which is what the model reads at inference: each assistant
    turn trained from where its rendering leaves the generation prompt's (the generation prompt's common part:
    ``<|im_start|>assistant\n``) to the first stop token after its content, as the whole renders it. The messages
    before each assistant turn must still render as the beginning of the whole (else not prefix-stable)."""
    whole = _render(location, key, render, messages, len(messages), gen=False)
    pieces: list[Piece] = []
    done = 0  # the whole rendering cut into pieces up to here
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        context = _render(location, key, render, messages, i, gen=False)
        if not whole.startswith(context) or len(context) < done:
            raise DataError(
                f"{location}: field {key!r} message {i}: the chat template is not prefix-stable: the messages "
                f"before this assistant turn do not render as the beginning of the whole conversation, so its "
                f"turn cannot be found in it; use a template that renders a conversation as the rendering of its "
                f"beginning followed by the rest"
            )
        opening = _render(location, key, render, messages, i, gen=True)
        start = len(context)
        while start < min(len(opening), len(whole)) and opening[start] == whole[start]:
            start += 1
        content = message["content"]
        at = whole.find(content, len(context)) if isinstance(content, str) and content else -1
        if 0 <= at < start:  # the content begins like the generation prompt's rest: trained whole
            start = at
        content_end = at + len(content) if at >= 0 else start
        ends = [
            (whole.find(stop, content_end), stop) for stop in stops.values() if stop in whole[content_end:]
        ]
        if not ends:
            raise DataError(
                f"{location}: field {key!r} message {i}: the chat template does not end assistant turns with "
                f"a stop token of the model ({', '.join(map(repr, stops.values()))}); it renders the rest of the "
                f"conversation as {whole[start:]!r}"
            )
        position, stop = min(ends)
        end = position + len(stop)
        pieces += [(whole[done:start], 0), (whole[start:end], 1)]
        done = end
    pieces.append((whole[done:], 0))
    return [piece for piece in pieces if piece[0]], whole


def _check_conversation_ids(
    location: str,
    pieces: list[Piece],
    ids_of_pieces: list[list[int]],
    whole_ids: list[int],
    stops: dict[int, str] | None,
    tokenizer: Any,
) -> None:
    """The pieces' tokens must be those of the whole rendering; with `stops`, each trained piece ends in a
    stop id."""
    joined = [token for ids in ids_of_pieces for token in ids]
    if joined != list(whole_ids):
        at = next(
            (j for j, (a, b) in enumerate(zip(joined, whole_ids)) if a != b), min(len(joined), len(whole_ids))
        )
        raise DataError(
            f"{location}: tokenizing the conversation turn by turn gives other tokens than tokenizing it "
            f"whole (first difference at token {at}: the tokenizer merges text across a turn boundary), "
            f"so the loss mask would not line up with the tokens; use a tokenizer whose turn markers are "
            f"special tokens"
        )
    for (text, trained), ids in zip(pieces, ids_of_pieces):
        if stops is not None and trained and (not ids or ids[-1] not in stops):
            end = tokenizer.convert_ids_to_tokens(ids[-1]) if ids else None
            raise DataError(
                f"{location}: an assistant turn {text!r:.60} ends in token {end!r}, not one stop token "
                f"({', '.join(map(repr, stops.values()))}); the stop token must be a single (special) token"
            )
