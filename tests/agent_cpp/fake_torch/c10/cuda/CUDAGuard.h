#pragma once
#include "CUDACachingAllocator.h"
