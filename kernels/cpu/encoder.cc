#include "kernels/encoder.h"

#include <cstdint>

#include "kernels/cpu/column_sum.h"
#include "kernels/half.h"
#include "kernels/cpu/isa_target.h"

PSTAR_CPU_ISA_BEGIN
namespace pstar::kernels::cpu {

namespace {

// The token rows [row0, row0 + rows) of tables of element W (wte holds
// those rows), read through `wide` (float to float, or a 16-bit format to
// float), added in fp32 and stored through `store` (float to O); tokens
// outside the rows are skipped.
template <typename O, typename W, typename Wide, typename Store>
void EncoderForwardRows(O* out, const int32_t* tokens, const int32_t* positions, const W* wte, const W* wpe,
                        int64_t B, int64_t T, int64_t C, Wide wide, Store store, int64_t row0 = 0,
                        int64_t rows = INT64_MAX) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = int64_t(tokens[b * T + t]) - row0;
      if (row < 0 || row >= rows) continue;
      O* o = out + (b * T + t) * C;
      const W* e = wte + row * C;
      if (wpe == nullptr) {
        for (int64_t c = 0; c < C; ++c) o[c] = store(wide(e[c]));
        continue;
      }
      const W* p = wpe + (positions != nullptr ? int64_t(positions[b * T + t]) : t) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = store(wide(e[c]) + wide(p[c]));
    }
  }
}

// dwte's rows [row0, row0 + rows) (dwte holds those rows) take the dout of
// their tokens, and dwpe (unless null) every token's. Each thread owns a
// range of channels and walks every row in order, so the sum order per
// element is fixed and no two threads write the same element.
void EncoderBackwardRows(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                         int64_t B, int64_t T, int64_t C, int64_t row0 = 0, int64_t rows = INT64_MAX) {
#pragma omp parallel
  {
    auto [c0, c1] = ThreadColumns(C);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const float* d = dout + (b * T + t) * C;
        const int64_t row = int64_t(tokens[b * T + t]) - row0;
        if (row >= 0 && row < rows) {
          float* e = dwte + row * C;
          for (int64_t c = c0; c < c1; ++c) e[c] += d[c];
        }
        if (dwpe == nullptr) continue;
        float* p = dwpe + (positions != nullptr ? int64_t(positions[b * T + t]) : t) * C;
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  }
}

}  // namespace

void EncoderForward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                    int64_t B, int64_t T, int64_t C) {
  EncoderForwardRows(out, tokens, positions, wte, wpe, B, T, C, KeepFloat{}, KeepFloat{});
}

void EncoderForward(uint16_t* out, const int32_t* tokens, const int32_t* positions, const uint16_t* wte,
                    const uint16_t* wpe, bool bf16, int64_t B, int64_t T, int64_t C) {
  if (bf16) return EncoderForwardRows(out, tokens, positions, wte, wpe, B, T, C, WidenBf16{}, NarrowBf16{});
  EncoderForwardRows(out, tokens, positions, wte, wpe, B, T, C, WidenHalf{}, NarrowHalf{});
}

void EncoderForward(uint16_t* out, bool bf16, const int32_t* tokens, const int32_t* positions, const float* wte,
                    const float* wpe, int64_t B, int64_t T, int64_t C) {
  if (bf16) return EncoderForwardRows(out, tokens, positions, wte, wpe, B, T, C, KeepFloat{}, NarrowBf16{});
  EncoderForwardRows(out, tokens, positions, wte, wpe, B, T, C, KeepFloat{}, NarrowHalf{});
}

void EncoderPartForward(float* out, const int32_t* tokens, const float* part, int64_t row0, int64_t rows, int64_t B,
                        int64_t T, int64_t C) {
  EncoderForwardRows(out, tokens, nullptr, part, static_cast<const float*>(nullptr), B, T, C, KeepFloat{}, KeepFloat{},
                     row0, rows);
}

void EncoderPartForward(uint16_t* out, const int32_t* tokens, const uint16_t* part, bool bf16, int64_t row0,
                        int64_t rows, int64_t B, int64_t T, int64_t C) {
  const uint16_t* none = nullptr;
  if (bf16) return EncoderForwardRows(out, tokens, nullptr, part, none, B, T, C, WidenBf16{}, NarrowBf16{}, row0, rows);
  EncoderForwardRows(out, tokens, nullptr, part, none, B, T, C, WidenHalf{}, NarrowHalf{}, row0, rows);
}

void EncoderPartForward(uint16_t* out, bool bf16, const int32_t* tokens, const float* part, int64_t row0,
                        int64_t rows, int64_t B, int64_t T, int64_t C) {
  const float* none = nullptr;
  if (bf16) return EncoderForwardRows(out, tokens, nullptr, part, none, B, T, C, KeepFloat{}, NarrowBf16{}, row0, rows);
  EncoderForwardRows(out, tokens, nullptr, part, none, B, T, C, KeepFloat{}, NarrowHalf{}, row0, rows);
}

void EncoderPartBackward(float* dpart, const float* dout, const int32_t* tokens, int64_t row0, int64_t rows,
                         int64_t B, int64_t T, int64_t C) {
  EncoderBackwardRows(dpart, nullptr, dout, tokens, nullptr, B, T, C, row0, rows);
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                     int64_t B, int64_t T, int64_t C) {
  EncoderBackwardRows(dwte, dwpe, dout, tokens, positions, B, T, C);
}

}  // namespace pstar::kernels::cpu
PSTAR_CPU_ISA_END
