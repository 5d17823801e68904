#!/usr/bin/env python3
"""Pack the output of make_quant_fixtures.c into a GGUF fixture: tensor
`input` (f32), and per type `q.<TYPE>` (ggml's quantized bytes, typed) and
`deq.<TYPE>` (ggml's dequantization, f32). Written with the gguf package."""
import struct
import sys

import numpy as np
import gguf

raw = open(sys.argv[1], "rb").read()
out = sys.argv[2]
n_types = struct.unpack_from("<I", raw, 0)[0]
N_PER_ROW, N_ROWS = 512, 4
n = N_PER_ROW * N_ROWS
pos = 4
inp = np.frombuffer(raw, dtype=np.float32, count=n, offset=pos)
pos += 4 * n
w = gguf.GGUFWriter(out, "fixture")
w.add_string("fixture.source", "ggml (llama.cpp from llama-cpp-python==0.3.36): ggml_quantize_chunk + type_traits.to_float")
w.add_tensor("input", inp.reshape(N_ROWS, N_PER_ROW))
for _ in range(n_types):
    ty, ne, nb = struct.unpack_from("<III", raw, pos)
    pos += 12
    q = np.frombuffer(raw, dtype=np.uint8, count=nb, offset=pos)
    pos += nb
    deq = np.frombuffer(raw, dtype=np.float32, count=ne, offset=pos)
    pos += 4 * ne
    t = gguf.GGMLQuantizationType(ty)
    w.add_tensor(f"q.{t.name}", q.reshape(N_ROWS, -1), raw_dtype=t)
    w.add_tensor(f"deq.{t.name}", deq.reshape(N_ROWS, N_PER_ROW))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {out}")
