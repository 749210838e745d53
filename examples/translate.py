"""Translate lines with an encoder/decoder model (mBART-50 style: source language in the tokenizer, target
language code first in the decoder), beam search from the model's generation_config.json unless overridden.

    python examples/translate.py --model path/to/mbart-50 --src-lang en_XX --tgt-lang de_DE lines.txt
"""
import argparse

from seq2seq_engine import LLM, BeamSearchParams


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lines", help="text file, one sentence per line")
    parser.add_argument("--model", required=True, help="translation model directory")
    parser.add_argument("--src-lang", default=None, help="source language code (mBART tokenizers)")
    parser.add_argument("--tgt-lang", default=None, help="target language code, e.g. de_DE (mBART)")
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    with open(args.lines, encoding="utf-8") as handle:
        lines = [line.strip() for line in handle if line.strip()]

    llm = LLM(args.model)
    tokenizer = llm.get_tokenizer()
    if args.src_lang:
        tokenizer.src_lang = args.src_lang
    decoder = {"prompt_token_ids": [tokenizer.convert_tokens_to_ids(args.tgt_lang)]} if args.tgt_lang else None
    prompts = [{"encoder_prompt": line, "decoder_prompt": decoder} if decoder else line for line in lines]
    params = BeamSearchParams(beam_width=args.beam_width, max_tokens=args.max_tokens)
    for line, output in zip(lines, llm.beam_search(prompts, params)):
        print(f"{line}\n  -> {output.outputs[0].text.strip()}")


if __name__ == "__main__":
    main()
