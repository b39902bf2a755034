// library_types.h of tp's emulated GPU (dev/emu): the data-type enum the CUDA libraries share.
// Only fp32 is emulated, so only CUDA_R_32F is declared: another type fails to compile.
#pragma once
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
} cudaDataType;
