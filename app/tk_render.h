/* tk_render.h — turning results into what a notebook or a shell shows.
 *
 * Tables render as aligned text (text/plain) and as HTML (text/html); charts
 * render as SVG made here in C (image/svg+xml) and as a Vega-Lite v5 spec
 * (application/vnd.vegalite.v5+json) for JupyterLab. Colab has no Vega-Lite
 * renderer, so every bundle also carries the HTML/SVG form and text/plain.
 *
 * Ownership: *_new return new objects (destroy with the matching *_destroy);
 * functions returning char * return a new string the caller free()s; json_t *
 * returns are new references. Strings passed in are copied.
 */
#ifndef TK_RENDER_H
#define TK_RENDER_H

#include <jansson.h>
#include <stddef.h>

/* ---- a growable string --------------------------------------------------- */

typedef struct tk_sb { char *p; size_t len, cap; int oom; } tk_sb;
void tk_sb_addf(tk_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tk_sb_add(tk_sb *b, const char *s);
/* Appends s with & < > " ' escaped for HTML/SVG text and attributes. */
void tk_sb_add_html(tk_sb *b, const char *s);
/* The string (new; "" when empty; NULL after a failed allocation). Resets b. */
char *tk_sb_take(tk_sb *b);
void tk_sb_clear(tk_sb *b);

/* ---- tables --------------------------------------------------------------- */

typedef struct tk_rtable tk_rtable;
/* A table with `ncols` columns. Columns whose header starts with '>' are
 * right-aligned (numbers); the '>' is not shown. */
tk_rtable *tk_rtable_new(const char *title, int ncols, const char *const *headers);
void tk_rtable_destroy(tk_rtable **pt);
/* Appends a row of ncols cells (copied; NULL shows as empty). 0, or -1 on OOM. */
int tk_rtable_row(tk_rtable *t, const char *const *cells);
/* Same with printf-formatted cells separated by '\t'. */
int tk_rtable_rowf(tk_rtable *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tk_rtable_nrows(const tk_rtable *t);
const char *tk_rtable_cell(const tk_rtable *t, int row, int col); /* borrowed */
char *tk_rtable_text(const tk_rtable *t);
char *tk_rtable_html(const tk_rtable *t);
/* [{header: cell, ...}, ...] with numeric-looking cells as numbers. */
json_t *tk_rtable_json(const tk_rtable *t);

/* ---- charts -------------------------------------------------------------- */

/* A bar chart of n bars (labels[i], values[i]); unit names the value axis. */
char *tk_svg_bars(const char *title, const char *unit, int n, const char *const *labels,
                  const double *values);
json_t *tk_vegalite_bars(const char *title, const char *label_field, const char *value_field,
                         int n, const char *const *labels, const double *values);
/* A line chart of `nseries` series over the same n x values;
 * y[s*n + i] is series s at x[i]. */
char *tk_svg_lines(const char *title, const char *xunit, const char *yunit, int n, const double *x,
                   int nseries, const char *const *names, const double *y);
json_t *tk_vegalite_lines(const char *title, const char *xfield, const char *yfield, int n,
                          const double *x, int nseries, const char *const *names, const double *y);

/* An HTML progress bar: frac in [0,1], `label` shown beside it (escaped). */
char *tk_html_progress(double frac, const char *label);
/* A text progress bar of `width` cells: "[#####.....]  label". */
char *tk_text_progress(double frac, int width, const char *label);

/* ---- MIME bundles -------------------------------------------------------- */

/* {"text/plain": text}. New reference. */
json_t *tk_bundle_new(const char *text);
/* Sets bundle[mime] = s (a string); takes ownership of s (free()d), which may
 * be NULL (then nothing is set). 0, or -1 when nothing was set (s NULL, or
 * out of host memory): a caller that needs the part checks it. */
int tk_bundle_take(json_t *bundle, const char *mime, char *s);
/* Sets bundle[mime] = j; takes the reference (NULL: nothing set). 0 or -1,
 * as tk_bundle_take. */
int tk_bundle_take_json(json_t *bundle, const char *mime, json_t *j);

/* Report builders put their machine-readable part under "application/json"
 * (what `txk --json` and `%... --json` print). A notebook must not get it
 * there: JupyterLab and Notebook 7 rank their JSON viewer (rank 0) above HTML
 * (50) and SVG (80), and VS Code's display order starts with
 * application/json, so the JSON tree would hide the report. This returns a
 * shallow copy of bundle (new reference; NULL on OOM) whose "application/json"
 * is moved to "application/vnd.txkernel.<what>+json", a type no frontend
 * renders by default (renderers match exact types), so text/html (or SVG,
 * Vega-Lite) is what users see and the data stays in the output. */
json_t *tk_bundle_for_notebook(json_t *bundle, const char *what);

/* Byte counts with two decimals as PyTorch prints them ("24.00 MiB"). */
const char *tk_render_bytes(size_t bytes, char buf[32]);

#endif
