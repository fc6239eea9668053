"""The recipe's `data:` section as named arrays: one module per job.

The stages import `zoo_stages.lib.data.datasets` (the public API: `load_split`, `Split`,
`preprocessing`...); this package holds its parts:

- `images`: digits, image folders and image arrays; the transforms (scale, channels, bilinear
  resize to H x W, mean/std, layout);
- `npz`: numpy archives of named arrays (one per model input, plus the labels);
- `tables`: CSV, Parquet and JSON-lines tables: columns, labels, standard normalisation;
- `text`: Hugging Face `tokenizers`: a tokenizer file or one trained on the train split;
- `corpus`: a causal language model's documents (.jsonl, .txt), its byte-level BPE, the
  `input_ids` blocks and the tokenizer files a generator ships;
- `dvc`: a file or folder tracked in a DVC repo at a full commit sha: its pin for keys, its bytes;
- `split`: the deterministic sha256 shuffle and the (stratified) train/held-out split;
- `loaded`: `Loaded`, what every source gives before the split.
"""
