"""Small table and API map used by the table tests."""

MINI = """\
version: "9.9.9"
torch_neuronx: "9.9.9.0"
neuron_sdk: "2.33.0"
torch: "2.13.0"
sources:
  docs: {url: "https://example.invalid/docs", kind: aws_docs, confidence: high}
  pre: {url: "https://example.invalid/src", kind: prerelease_source, confidence: medium}
entries:
  - {name: aten::atan2, kind: aten_op, status: cpu_fallback, source: pre}
  - {name: aten::add.Tensor, kind: aten_op, status: native, source: pre}
  - {name: aten::add.out, kind: aten_op, status: native, source: pre}
  - {name: aten::min.dim, kind: aten_op, status: native, source: pre}
  - {name: aten::min.other, kind: aten_op, status: unsupported, source: pre}
  - {name: aten::mm, kind: aten_op, status: native, source: pre}
  - {name: aten::linalg_qr, kind: aten_op, status: cpu_fallback, source: pre}
  - {name: torch.sparse, kind: namespace, status: unsupported, source: docs, note: no sparse}
  - {name: torch.fft, kind: namespace, status: partial, source: docs}
  - {name: torch.compile:dynamic, kind: compile_param, status: unsupported, source: docs}
  - {name: torch.distributed:send, kind: distributed, status: unsupported, source: pre}
  - {name: torch.float64, kind: api, status: partial, source: docs, dtypes: "float64 -> float32"}
"""

MINI_MAP = """\
torch: 2.13.0
command: test
apis:
  torch.atan2: [aten::atan2]
  Tensor.atan2: [aten::atan2]
  torch.mix: [aten::mm, aten::atan2, aten::nope]
  torch.mm: [aten::mm]
  torch.add: [aten::add.Tensor]
  torch.unknownish: [aten::mm, aten::nope]
  torch.nn.functional.foo: [aten::mm]
"""
