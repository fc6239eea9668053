"""quantize's helpers: `quant_settings` (presets, candidates), `quant_select` (auto's choice),
`quant_ops` (blockwise linear layers, calibration reader), `weight_only` (mode: weight_only, through
onnxruntime's MatMulNBitsQuantizer), `decoder_eval` (how a decoder is judged, calibrated and timed)."""
