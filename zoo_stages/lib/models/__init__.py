"""The models train and export build: `archs` (torch.nn architectures and their inputs),
`vision_archs` (torchvision's networks in plain torch.nn), `hf_models` (Hugging Face models),
`checkpoints` (safetensors save, weights_only load), `finetune` (a network from a zoo parent),
`torch_eval` (inputs, loss and figures by task), `training_split`, `training_tools`, and the
other frameworks: `estimators/` (scikit-learn, LightGBM, XGBoost), `entry_models/` (Keras, JAX)."""
