import json
from pathlib import Path

SMALL_MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat_row(content: str, data_source: str = "addition", ground_truth="1", index: int | None = None) -> dict:
    extra_info = {"split": "train"} if index is None else {"index": index, "split": "train"}
    return {
        "prompt": [{"role": "user", "content": content}],
        "data_source": data_source,
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": extra_info,
    }


def char_ids(text: str) -> list[int]:
    """Ids of plain ASCII text in the tiny tokenizer: 4 special tokens, then one id per byte."""
    return [4 + b for b in text.encode()]


def chat_ids(content: str) -> list[int]:
    """Ids of ``<|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n`` (im_start 2, im_end 3)."""
    return [2, *char_ids(f"user\n{content}"), 3, *char_ids("\n"), 2, *char_ids("assistant\n")]


def png(width: int, height: int, colour: tuple[int, int, int], diagonal: bool = False) -> bytes:
    """A PNG of one colour (`diagonal`: with white dots along a diagonal, for the vision tower to see)."""
    import io

    from PIL import Image

    image = Image.new("RGB", (width, height), colour)
    if diagonal:
        for x in range(0, width, 7):
            image.putpixel((x, x % height), (255, 255, 255))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
