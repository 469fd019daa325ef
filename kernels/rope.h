// Rotary position embeddings as the Llama family applies them (rotate-half:
// a head's first half pairs with its second), on q and k heads in place.
// Each token carries its own position, so a packed row may restart them.
#ifndef PSTAR_KERNELS_ROPE_H_
#define PSTAR_KERNELS_ROPE_H_
#include <cstdint>

namespace pstar::kernels {

// Llama 3's frequency scaling (rope_scaling of type llama3); off: none.
struct RopeScaling {
  bool llama3 = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// The cos and sin tables (positions, head_dim / 2): entry (p, i) of the angle
// p * inv_freq_i, inv_freq_i = theta^(-2i / head_dim) scaled as `scaling`
// says. Computed once in double and stored as fp32, so every backend reads
// the same bits. head_dim must be even.
void RopeTables(float* cos, float* sin, int64_t positions, int64_t head_dim, double theta,
                const RopeScaling& scaling);

}  // namespace pstar::kernels
#endif  // PSTAR_KERNELS_ROPE_H_

// The kernels' declarations stay outside the include guard (kernels/layernorm.h
// says why).

namespace pstar::kernels::cpu {

// Rotates `heads` heads of head_dim D in each of N rows, row n starting at
// x + n * row_stride (q or k inside a q|k|v row), by position positions[n]:
// for i < D/2, (x_i, x_{i+D/2}) becomes (x_i cos - x_{i+D/2} sin,
// x_{i+D/2} cos + x_i sin).
void RopeForward(float* x, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions,
                 int64_t N, int64_t heads, int64_t D);
// The same over 16-bit x (bfloat16 when `bf16`, else IEEE half): widened,
// rotated in fp32 and rounded once.
void RopeForward(uint16_t* x, bool bf16, int64_t row_stride, const float* cos, const float* sin,
                 const int32_t* positions, int64_t N, int64_t heads, int64_t D);
// The rotation's transpose on a gradient in place: (d_i, d_{i+D/2}) becomes
// (d_i cos + d_{i+D/2} sin, d_{i+D/2} cos - d_i sin).
void RopeBackward(float* dx, int64_t row_stride, const float* cos, const float* sin, const int32_t* positions,
                  int64_t N, int64_t heads, int64_t D);

}  // namespace pstar::kernels::cpu
