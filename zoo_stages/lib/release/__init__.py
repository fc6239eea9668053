"""What a release holds: `provenance` (stamps, zoo.lock, the in-toto statement), `modelcard`,
`release_folder` (the folder's completeness check), `vectors` (ONNX Model Zoo test vectors)."""
