// The region of a kernel file that its instruction-set variant compiles for
// the variant's CPU features (kernels/cpu/isa.h). PSTAR_CPU_ISA_BEGIN goes
// after the file's last #include, PSTAR_CPU_ISA_END at its end.
//
// The features come from a pragma over that region rather than from -march
// for the whole file: the C++ library's templates and inline functions are
// then declared outside it, so the weak copies of them a variant's object may
// carry are baseline code, whichever copy the linker keeps; a -march=x86-64-v4
// copy of std::vector<float>'s constructor kept for the whole program would
// fault on a CPU without AVX-512. Inline helpers declared outside the region
// (kernels/half.h, vector_math.h) still inline into it: the region only adds
// features, it keeps the architecture and tuning of the build. GCC's OpenMP
// regions take their function's features with them.
//
// PSTAR_CPU_ISA_LEVEL (set by kernels/CMakeLists.txt for a variant) is 3 for
// x86-64-v3 (AVX2, FMA, BMI2) and 4 for x86-64-v4 (adds AVX-512 F, BW, CD,
// DQ, VL); unset, the region is empty and the file takes the build's flags.
#ifndef PSTAR_KERNELS_CPU_ISA_TARGET_H_
#define PSTAR_KERNELS_CPU_ISA_TARGET_H_

// clang-format off
#if defined(PSTAR_CPU_ISA_LEVEL) && PSTAR_CPU_ISA_LEVEL == 3
#define PSTAR_CPU_ISA_FEATURES "avx,avx2,bmi,bmi2,f16c,fma,lzcnt,movbe,popcnt,sse3,ssse3,sse4.1,sse4.2,xsave"
#elif defined(PSTAR_CPU_ISA_LEVEL) && PSTAR_CPU_ISA_LEVEL == 4
#define PSTAR_CPU_ISA_FEATURES "avx,avx2,bmi,bmi2,f16c,fma,lzcnt,movbe,popcnt,sse3,ssse3,sse4.1,sse4.2,xsave,avx512f,avx512bw,avx512cd,avx512dq,avx512vl"
#elif defined(PSTAR_CPU_ISA_LEVEL)
#error "PSTAR_CPU_ISA_LEVEL must be 3 or 4"
#endif
// clang-format on

// _Pragma of a macro-expanded argument.
#define PSTAR_CPU_ISA_PRAGMA_STRING(x) _Pragma(#x)
#define PSTAR_CPU_ISA_PRAGMA(x) PSTAR_CPU_ISA_PRAGMA_STRING(x)
#if !defined(PSTAR_CPU_ISA_FEATURES)
#define PSTAR_CPU_ISA_BEGIN
#define PSTAR_CPU_ISA_END
#elif defined(__clang__)
#define PSTAR_CPU_ISA_BEGIN \
  PSTAR_CPU_ISA_PRAGMA(clang attribute push(__attribute__((target(PSTAR_CPU_ISA_FEATURES))), apply_to = function))
#define PSTAR_CPU_ISA_END PSTAR_CPU_ISA_PRAGMA(clang attribute pop)
#elif defined(__GNUC__)
#define PSTAR_CPU_ISA_BEGIN PSTAR_CPU_ISA_PRAGMA(GCC push_options) PSTAR_CPU_ISA_PRAGMA(GCC target(PSTAR_CPU_ISA_FEATURES))
#define PSTAR_CPU_ISA_END PSTAR_CPU_ISA_PRAGMA(GCC pop_options)
#else
#error "the CPU kernel variants need GCC or Clang"
#endif

#endif  // PSTAR_KERNELS_CPU_ISA_TARGET_H_
