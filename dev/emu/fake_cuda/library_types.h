// library_types.h of tp's emulated GPU (dev/emu): the data-type enum the CUDA libraries share.
// fp32 and bf16 (the GEMMs' A and B) are emulated, so only CUDA_R_32F and CUDA_R_16BF are declared: another
// type fails to compile.
#pragma once
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_16BF = 14,
} cudaDataType;
