"""quantize's helpers: `quant_settings` (presets, candidates), `quant_select` (auto's choice),
`quant_ops` (blockwise linear layers, calibration reader)."""
