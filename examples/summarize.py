"""Summarize documents with a BART-family model: beam search and lengths from the model's generation_config.json.

    python examples/summarize.py --model path/to/bart-large-cnn docs.txt      # one document per line
"""
import argparse

from seq2seq_engine import LLM


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("documents", help="text file, one document per line")
    parser.add_argument("--model", required=True, help="BART-family model directory (weights, config, tokenizer)")
    parser.add_argument("--beam-width", type=int, default=None, help="default: the model's num_beams")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: the model's max_length")
    args = parser.parse_args()
    with open(args.documents, encoding="utf-8") as handle:
        documents = [line.strip() for line in handle if line.strip()]

    llm = LLM(args.model)
    # Model defaults (generation_config.json), with whatever the command line overrides.
    overrides = {k: v for k, v in (("beam_width", args.beam_width), ("max_tokens", args.max_tokens)) if v}
    outputs = llm.generate(documents, overrides or None)
    for document, output in zip(documents, outputs):
        print(f"document: {document[:80]}...")
        print(f"summary:  {output.outputs[0].text.strip()}\n")


if __name__ == "__main__":
    main()
