/*
 * zs/zs.h - the whole public API of Zhisuan (智算). Include this one header.
 */
#ifndef ZS_ZS_H
#define ZS_ZS_H

#include "core.h"
#include "ops.h"
#include "linear.h"
#include "autograd.h"
#include "graph.h"
#include "analyze.h"
#include "attention.h"
#include "io.h"
#include "text.h"
#include "nn.h"
#include "optim.h"
#include "infer.h"
#include "dist.h"
#include "dp.h"
#include "zero.h"
#include "ps.h"
#include "tp.h"
#include "onebit.h"
#include "train.h"
#include "kv_pool.h"
#include "serve.h"

#define ZS_VERSION "0.1.0"

#endif
