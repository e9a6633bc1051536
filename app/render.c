/* render.c — text, HTML, SVG and Vega-Lite renderings of tables and charts
 * (implements tk_render.h).
 *
 * Guarantees: every string that came from the user or the data is escaped
 * before it goes into HTML or SVG; SVG output is a standalone document with
 * the xmlns attribute (Jupyter displays it in an <img>-like context, and
 * nbconvert embeds it as is); a failed host allocation gives NULL, never a
 * truncated document.
 */
#include "tk_render.h"
#include "tk_host_mem.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_gpu.h"

/* ---- string builder -------------------------------------------------------- */

static int sb_reserve(tk_sb *b, size_t extra) {
    if (b->oom) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < b->len + extra + 1) ncap *= 2;
    char *np = tk_realloc(b->p, ncap);
    if (!np) { b->oom = 1; return -1; }
    b->p = np;
    b->cap = ncap;
    return 0;
}

void tk_sb_addf(tk_sb *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (w < 0 || sb_reserve(b, (size_t)w)) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)w;
}

void tk_sb_add(tk_sb *b, const char *s) {
    size_t n = strlen(s);
    if (sb_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

void tk_sb_add_html(tk_sb *b, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': tk_sb_add(b, "&amp;"); break;
        case '<': tk_sb_add(b, "&lt;"); break;
        case '>': tk_sb_add(b, "&gt;"); break;
        case '"': tk_sb_add(b, "&quot;"); break;
        case '\'': tk_sb_add(b, "&#39;"); break;
        default:
            if (sb_reserve(b, 1)) return;
            b->p[b->len++] = *s;
            b->p[b->len] = 0;
        }
    }
}

char *tk_sb_take(tk_sb *b) {
    char *p = b->p;
    if (b->oom) { free(p); p = NULL; }
    else if (!p) { p = tk_malloc(1); if (p) p[0] = 0; }
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
    return p;
}

void tk_sb_clear(tk_sb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- tables ------------------------------------------------------------------ */

struct tk_rtable {
    char *title;
    int ncols, nrows, cap;
    char **headers;  /* ncols, without the '>' */
    int *right;      /* ncols */
    char **cells;    /* nrows * ncols */
};

static char *dupstr(const char *s) {
    s = s ? s : "";
    size_t n = strlen(s) + 1;
    char *p = tk_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

tk_rtable *tk_rtable_new(const char *title, int ncols, const char *const *headers) {
    tk_rtable *t = tk_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->ncols = ncols;
    t->title = dupstr(title);
    t->headers = tk_calloc((size_t)ncols, sizeof *t->headers);
    t->right = tk_calloc((size_t)ncols, sizeof *t->right);
    if (!t->title || !t->headers || !t->right) { tk_rtable_destroy(&t); return NULL; }
    for (int i = 0; i < ncols; i++) {
        const char *h = headers[i] ? headers[i] : "";
        t->right[i] = h[0] == '>';
        if (!(t->headers[i] = dupstr(h + t->right[i]))) { tk_rtable_destroy(&t); return NULL; }
    }
    return t;
}

void tk_rtable_destroy(tk_rtable **pt) {
    if (!pt || !*pt) return;
    tk_rtable *t = *pt;
    for (int i = 0; i < t->nrows * t->ncols; i++) free(t->cells[i]);
    for (int i = 0; t->headers && i < t->ncols; i++) free(t->headers[i]);
    free(t->cells);
    free(t->headers);
    free(t->right);
    free(t->title);
    free(t);
    *pt = NULL;
}

int tk_rtable_row(tk_rtable *t, const char *const *cells) {
    if (t->nrows == t->cap) {
        int ncap = t->cap ? t->cap * 2 : 16;
        char **nc = tk_realloc(t->cells, (size_t)ncap * (size_t)t->ncols * sizeof *nc);
        if (!nc) return -1;
        t->cells = nc;
        t->cap = ncap;
    }
    char **row = t->cells + (size_t)t->nrows * (size_t)t->ncols;
    for (int i = 0; i < t->ncols; i++) {
        row[i] = dupstr(cells[i]);
        if (!row[i]) {
            while (i--) free(row[i]);
            return -1;
        }
    }
    t->nrows++;
    return 0;
}

int tk_rtable_rowf(tk_rtable *t, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    const char *cells[64];
    if (t->ncols > 64) return -1;
    char *p = buf;
    for (int i = 0; i < t->ncols; i++) {
        cells[i] = p ? p : "";
        if (p) {
            char *tab = strchr(p, '\t');
            if (tab) { *tab = 0; p = tab + 1; }
            else p = NULL;
        }
    }
    return tk_rtable_row(t, cells);
}

int tk_rtable_nrows(const tk_rtable *t) { return t->nrows; }

const char *tk_rtable_cell(const tk_rtable *t, int row, int col) {
    if (row < 0 || row >= t->nrows || col < 0 || col >= t->ncols) return NULL;
    return t->cells[(size_t)row * (size_t)t->ncols + (size_t)col];
}

/* Display width of UTF-8 text: one column per code point (no wide-glyph
 * tables; owner names and numbers are ASCII). */
static int text_width(const char *s) {
    int w = 0;
    for (; *s; s++) if (((unsigned char)*s & 0xC0) != 0x80) w++;
    return w;
}

static void pad_cell(tk_sb *b, const char *s, int width, int right) {
    int pad = width - text_width(s);
    if (right) for (int i = 0; i < pad; i++) tk_sb_add(b, " ");
    tk_sb_add(b, s);
    if (!right) for (int i = 0; i < pad; i++) tk_sb_add(b, " ");
}

char *tk_rtable_text(const tk_rtable *t) {
    tk_sb b = {0};
    int *w = tk_calloc((size_t)t->ncols, sizeof *w);
    if (!w) return NULL;
    for (int c = 0; c < t->ncols; c++) {
        w[c] = text_width(t->headers[c]);
        for (int r = 0; r < t->nrows; r++) {
            int cw = text_width(tk_rtable_cell(t, r, c));
            if (cw > w[c]) w[c] = cw;
        }
    }
    if (t->title[0]) tk_sb_addf(&b, "%s\n", t->title);
    for (int c = 0; c < t->ncols; c++) {
        if (c) tk_sb_add(&b, "  ");
        pad_cell(&b, t->headers[c], c == t->ncols - 1 && !t->right[c] ? 0 : w[c], t->right[c]);
    }
    tk_sb_add(&b, "\n");
    for (int c = 0; c < t->ncols; c++) {
        if (c) tk_sb_add(&b, "  ");
        for (int i = 0; i < w[c]; i++) tk_sb_add(&b, "-");
    }
    tk_sb_add(&b, "\n");
    for (int r = 0; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            if (c) tk_sb_add(&b, "  ");
            pad_cell(&b, tk_rtable_cell(t, r, c), c == t->ncols - 1 && !t->right[c] ? 0 : w[c], t->right[c]);
        }
        tk_sb_add(&b, "\n");
    }
    free(w);
    return tk_sb_take(&b);
}

char *tk_rtable_html(const tk_rtable *t) {
    tk_sb b = {0};
    tk_sb_add(&b, "<table class=\"txk\" style=\"border-collapse:collapse\">");
    if (t->title[0]) {
        tk_sb_add(&b, "<caption style=\"text-align:left;font-weight:bold\">");
        tk_sb_add_html(&b, t->title);
        tk_sb_add(&b, "</caption>");
    }
    tk_sb_add(&b, "<thead><tr>");
    for (int c = 0; c < t->ncols; c++) {
        tk_sb_addf(&b, "<th style=\"text-align:%s;padding:2px 8px\">", t->right[c] ? "right" : "left");
        tk_sb_add_html(&b, t->headers[c]);
        tk_sb_add(&b, "</th>");
    }
    tk_sb_add(&b, "</tr></thead><tbody>");
    for (int r = 0; r < t->nrows; r++) {
        tk_sb_add(&b, "<tr>");
        for (int c = 0; c < t->ncols; c++) {
            tk_sb_addf(&b, "<td style=\"text-align:%s;padding:2px 8px\">", t->right[c] ? "right" : "left");
            tk_sb_add_html(&b, tk_rtable_cell(t, r, c));
            tk_sb_add(&b, "</td>");
        }
        tk_sb_add(&b, "</tr>");
    }
    tk_sb_add(&b, "</tbody></table>");
    return tk_sb_take(&b);
}

json_t *tk_rtable_json(const tk_rtable *t) {
    json_t *arr = json_array();
    if (!arr) return NULL;
    for (int r = 0; r < t->nrows; r++) {
        json_t *o = json_object();
        for (int c = 0; c < t->ncols; c++) {
            const char *s = tk_rtable_cell(t, r, c);
            char *end;
            double v = strtod(s, &end);
            json_t *val = (*s && !*end && isfinite(v))
                              ? (v == floor(v) && fabs(v) < 9e15 ? json_integer((json_int_t)v) : json_real(v))
                              : json_string(s);
            json_object_set_new(o, t->headers[c], val);
        }
        json_array_append_new(arr, o);
    }
    return arr;
}

/* ---- charts ------------------------------------------------------------------- */

/* A "nice" upper bound for an axis: 1, 2, 2.5 or 5 times a power of ten. */
static double nice_max(double v) {
    if (!(v > 0)) return 1;
    double p = pow(10, floor(log10(v)));
    static const double steps[] = {1, 2, 2.5, 5, 10};
    for (int i = 0; i < 5; i++) if (steps[i] * p >= v) return steps[i] * p;
    return 10 * p;
}

static void fmt_tick(double v, char *buf, size_t n) {
    if (v != 0 && (fabs(v) >= 1e6 || fabs(v) < 1e-2)) snprintf(buf, n, "%.3g", v);
    else if (v == floor(v)) snprintf(buf, n, "%.0f", v);
    else snprintf(buf, n, "%.2f", v);
}

#define SVG_W 640
#define SVG_H 300
#define M_LEFT 70
#define M_RIGHT 20
#define M_TOP 30
#define M_BOTTOM 60

static void svg_open(tk_sb *b, const char *title) {
    tk_sb_addf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                  "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">",
               SVG_W, SVG_H, SVG_W, SVG_H);
    tk_sb_add(b, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    tk_sb_addf(b, "<text x=\"%d\" y=\"18\" font-size=\"13\" font-weight=\"bold\">", M_LEFT);
    tk_sb_add_html(b, title ? title : "");
    tk_sb_add(b, "</text>");
}

/* y axis with 5 ticks from 0 to ymax; unit label rotated on the left. */
static void svg_yaxis(tk_sb *b, double ymax, const char *unit) {
    int ph = SVG_H - M_TOP - M_BOTTOM;
    for (int i = 0; i <= 4; i++) {
        double v = ymax * i / 4;
        double y = M_TOP + ph - ph * i / 4.0;
        char tick[32];
        fmt_tick(v, tick, sizeof tick);
        tk_sb_addf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>", M_LEFT,
                   SVG_W - M_RIGHT, y, y);
        tk_sb_addf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>", M_LEFT - 4, y + 4, tick);
    }
    if (unit && *unit) {
        tk_sb_addf(b, "<text transform=\"translate(14,%d) rotate(-90)\" text-anchor=\"middle\">",
                   M_TOP + ph / 2);
        tk_sb_add_html(b, unit);
        tk_sb_add(b, "</text>");
    }
}

char *tk_svg_bars(const char *title, const char *unit, int n, const char *const *labels,
                  const double *values) {
    tk_sb b = {0};
    double vmax = 0;
    for (int i = 0; i < n; i++) if (values[i] > vmax) vmax = values[i];
    double ymax = nice_max(vmax);
    int pw = SVG_W - M_LEFT - M_RIGHT, ph = SVG_H - M_TOP - M_BOTTOM;
    svg_open(&b, title);
    svg_yaxis(&b, ymax, unit);
    double slot = n > 0 ? (double)pw / n : pw;
    /* label every k-th bar so labels never overlap (about 40 px each) */
    int every = slot >= 40 ? 1 : (int)ceil(40 / slot);
    for (int i = 0; i < n; i++) {
        double h = values[i] > 0 ? ph * values[i] / ymax : 0;
        double x = M_LEFT + slot * i + slot * 0.1;
        tk_sb_addf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#4c78a8\">",
                   x, M_TOP + ph - h, slot * 0.8, h);
        char tick[32];
        fmt_tick(values[i], tick, sizeof tick);
        tk_sb_add(&b, "<title>");
        tk_sb_add_html(&b, labels[i]);
        tk_sb_addf(&b, ": %s</title></rect>", tick);
        if (i % every == 0) {
            tk_sb_addf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"end\" transform=\"rotate(-35 %.1f %d)\">",
                       x + slot * 0.4, M_TOP + ph + 14, x + slot * 0.4, M_TOP + ph + 14);
            tk_sb_add_html(&b, labels[i]);
            tk_sb_add(&b, "</text>");
        }
    }
    tk_sb_add(&b, "</svg>");
    return tk_sb_take(&b);
}

static json_t *vl_base(const char *title) {
    return json_pack("{s:s, s:s, s:i, s:i}", "$schema", "https://vega.github.io/schema/vega-lite/v5.json",
                     "title", title ? title : "", "width", 560, "height", 220);
}

json_t *tk_vegalite_bars(const char *title, const char *label_field, const char *value_field,
                         int n, const char *const *labels, const double *values) {
    json_t *spec = vl_base(title);
    json_t *rows = json_array();
    for (int i = 0; i < n; i++) {
        json_t *r = json_object();
        json_object_set_new(r, label_field, json_string(labels[i]));
        json_object_set_new(r, value_field, json_real(values[i]));
        json_object_set_new(r, "order", json_integer(i));
        json_array_append_new(rows, r);
    }
    json_object_set_new(spec, "data", json_pack("{s:o}", "values", rows));
    json_object_set_new(spec, "mark", json_string("bar"));
    json_object_set_new(spec, "encoding",
                        json_pack("{s:{s:s, s:s, s:{s:s}}, s:{s:s, s:s}, s:[{s:s},{s:s}]}",
                                  "x", "field", label_field, "type", "ordinal", "sort", "field", "order",
                                  "y", "field", value_field, "type", "quantitative",
                                  "tooltip", "field", label_field, "field", value_field));
    return spec;
}

static const char *const PALETTE[] = {"#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2"};

char *tk_svg_lines(const char *title, const char *xunit, const char *yunit, int n, const double *x,
                   int nseries, const char *const *names, const double *y) {
    tk_sb b = {0};
    double ymaxv = 0, xmin = n ? x[0] : 0, xmax = n ? x[0] : 1;
    for (int i = 0; i < n; i++) {
        if (x[i] < xmin) xmin = x[i];
        if (x[i] > xmax) xmax = x[i];
    }
    for (int i = 0; i < n * nseries; i++) if (y[i] > ymaxv) ymaxv = y[i];
    if (xmax == xmin) xmax = xmin + 1;
    double ymax = nice_max(ymaxv);
    int pw = SVG_W - M_LEFT - M_RIGHT, ph = SVG_H - M_TOP - M_BOTTOM;
    svg_open(&b, title);
    svg_yaxis(&b, ymax, yunit);
    for (int i = 0; i <= 4; i++) {
        double v = xmin + (xmax - xmin) * i / 4;
        char tick[32];
        fmt_tick(v, tick, sizeof tick);
        tk_sb_addf(&b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>", M_LEFT + pw * i / 4.0,
                   M_TOP + ph + 16, tick);
    }
    if (xunit && *xunit) {
        tk_sb_addf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", M_LEFT + pw / 2, M_TOP + ph + 34);
        tk_sb_add_html(&b, xunit);
        tk_sb_add(&b, "</text>");
    }
    for (int s = 0; s < nseries; s++) {
        const char *color = PALETTE[s % 6];
        tk_sb_addf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
        for (int i = 0; i < n; i++)
            tk_sb_addf(&b, "%s%.1f,%.1f", i ? " " : "", M_LEFT + pw * (x[i] - xmin) / (xmax - xmin),
                       M_TOP + ph - ph * (y[s * n + i] > 0 ? y[s * n + i] : 0) / ymax);
        tk_sb_add(&b, "\"/>");
        int lx = M_LEFT + 10 + s * 150;
        tk_sb_addf(&b, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>", lx, SVG_H - 18, color);
        tk_sb_addf(&b, "<text x=\"%d\" y=\"%d\">", lx + 14, SVG_H - 9);
        tk_sb_add_html(&b, names[s]);
        tk_sb_add(&b, "</text>");
    }
    tk_sb_add(&b, "</svg>");
    return tk_sb_take(&b);
}

json_t *tk_vegalite_lines(const char *title, const char *xfield, const char *yfield, int n,
                          const double *x, int nseries, const char *const *names, const double *y) {
    json_t *spec = vl_base(title);
    json_t *rows = json_array();
    for (int s = 0; s < nseries; s++)
        for (int i = 0; i < n; i++) {
            json_t *r = json_object();
            json_object_set_new(r, xfield, json_real(x[i]));
            json_object_set_new(r, yfield, json_real(y[s * n + i]));
            json_object_set_new(r, "series", json_string(names[s]));
            json_array_append_new(rows, r);
        }
    json_object_set_new(spec, "data", json_pack("{s:o}", "values", rows));
    json_object_set_new(spec, "mark", json_string("line"));
    json_object_set_new(spec, "encoding",
                        json_pack("{s:{s:s, s:s}, s:{s:s, s:s}, s:{s:s, s:s}}", "x", "field", xfield, "type",
                                  "quantitative", "y", "field", yfield, "type", "quantitative", "color",
                                  "field", "series", "type", "nominal"));
    return spec;
}

char *tk_html_progress(double frac, const char *label) {
    if (!(frac >= 0)) frac = 0;
    if (frac > 1) frac = 1;
    tk_sb b = {0};
    tk_sb_addf(&b, "<div style=\"font-family:monospace\"><progress value=\"%.4f\" max=\"1\" "
                   "style=\"width:320px;vertical-align:middle\"></progress> %.0f%% ",
               frac, frac * 100);
    tk_sb_add_html(&b, label ? label : "");
    tk_sb_add(&b, "</div>");
    return tk_sb_take(&b);
}

char *tk_text_progress(double frac, int width, const char *label) {
    if (!(frac >= 0)) frac = 0;
    if (frac > 1) frac = 1;
    tk_sb b = {0};
    int fill = (int)(frac * width + 0.5);
    tk_sb_add(&b, "[");
    for (int i = 0; i < width; i++) tk_sb_add(&b, i < fill ? "#" : ".");
    tk_sb_addf(&b, "] %3.0f%%  %s", frac * 100, label ? label : "");
    return tk_sb_take(&b);
}

/* ---- bundles -------------------------------------------------------------------- */

json_t *tk_bundle_new(const char *text) {
    return json_pack("{s:s}", "text/plain", text ? text : "");
}

int tk_bundle_take(json_t *bundle, const char *mime, char *s) {
    if (!s) return -1;
    int rc = json_object_set_new(bundle, mime, json_string(s));
    free(s);
    return rc;
}

int tk_bundle_take_json(json_t *bundle, const char *mime, json_t *j) {
    return j ? json_object_set_new(bundle, mime, j) : -1;
}

json_t *tk_bundle_for_notebook(json_t *bundle, const char *what) {
    json_t *b = json_copy(bundle);
    json_t *j = b ? json_object_get(b, "application/json") : NULL;
    if (!j) return b;
    char mime[128];
    snprintf(mime, sizeof mime, "application/vnd.txkernel.%s+json", what);
    if (json_object_set(b, mime, j) || json_object_del(b, "application/json")) {
        json_decref(b);
        return NULL;
    }
    return b;
}

const char *tk_render_bytes(size_t bytes, char buf[32]) {
    return tk_format_bytes(bytes, buf, 32);
}
