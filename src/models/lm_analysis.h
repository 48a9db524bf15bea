/* `moh analyze` data of the decoder LM (lm_analysis.c): labelled byte text. */
#ifndef MOH_LM_ANALYSIS_H
#define MOH_LM_ANALYSIS_H
#include "models/model.h"

/* model_family.open_analysis of the LM. req->data: a directory of <topic>.txt files (categories:
 * its topics.txt, first field per line, else its *.txt in name order; req->categories picks and
 * orders them) or FILE:LABEL[,FILE:LABEL...]. Per category the first req->max_tokens bytes (lines
 * holding only "%" removed), cut into consecutive chunks of T = req->seq_len (default
 * max_position_embeddings, at most the smaller context of model and twin) tokens, a shorter last
 * chunk run alone; batches of req->batch (default 8) chunks of one category. Errors: MOH_E_ARG
 * (bad spec, unknown or repeated category, T too long), MOH_E_IO, MOH_E_FORMAT (a category with
 * fewer than 2 bytes, no categories), MOH_E_NOMEM; each names the argument or file. */
int lm_open_analysis(const analysis_request *req, analysis_data *out, moh_error *err);
#endif
