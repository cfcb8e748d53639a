"""Build-time tools: the generated gRPC code and the generated reference pages. Not part of
the installed package."""
