/* test_render.c — tables, charts, progress bars and MIME bundles. */
#include <stdlib.h>
#include <string.h>
#include "tk_render.h"
#include "tk_test.h"

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void test_table_text_and_html(void) {
    const char *h[] = {"owner", ">bytes", ">share"};
    tk_rtable *t = tk_rtable_new("Top owners", 3, h);
    TK_CHECK(t != NULL);
    TK_CHECK_EQ_INT(tk_rtable_rowf(t, "%s\t%s\t%d%%", "classifier", "4.70 GiB", 61), 0);
    const char *r2[] = {"a<b>&\"c\"", "12", NULL};
    TK_CHECK_EQ_INT(tk_rtable_row(t, r2), 0);
    TK_CHECK_EQ_INT(tk_rtable_nrows(t), 2);
    TK_CHECK_STR(tk_rtable_cell(t, 0, 2), "61%");
    TK_CHECK_STR(tk_rtable_cell(t, 1, 2), "");
    TK_CHECK(tk_rtable_cell(t, 2, 0) == NULL);

    char *txt = tk_rtable_text(t);
    TK_CHECK_STR(txt,
                 "Top owners\n"
                 "owner          bytes  share\n"
                 "----------  --------  -----\n"
                 "classifier  4.70 GiB    61%\n"
                 "a<b>&\"c\"          12       \n");
    free(txt);

    char *html = tk_rtable_html(t);
    TK_CHECK(strstr(html, "a&lt;b&gt;&amp;&quot;c&quot;") != NULL);
    TK_CHECK(strstr(html, "<b>") == NULL);
    TK_CHECK_EQ_INT(count(html, "<tr>"), 3);
    TK_CHECK_EQ_INT(count(html, "text-align:right"), 6); /* 2 columns x (header + 2 rows) */
    free(html);

    json_t *j = tk_rtable_json(t);
    TK_CHECK_EQ_INT(json_array_size(j), 2);
    TK_CHECK_STR(json_string_value(json_object_get(json_array_get(j, 0), "bytes")), "4.70 GiB");
    TK_CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(j, 1), "bytes")), 12);
    json_decref(j);
    tk_rtable_destroy(&t);
    TK_CHECK(t == NULL);
    tk_rtable_destroy(&t);
}

static void test_svg_bars(void) {
    const char *labels[] = {"0-63", "64-127", "<script>"};
    double v[] = {10, 25, 0};
    char *svg = tk_svg_bars("Token lengths", "examples", 3, labels, v);
    TK_CHECK(svg != NULL);
    TK_CHECK(strncmp(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39) == 0);
    TK_CHECK(strstr(svg, "</svg>") != NULL);
    TK_CHECK_EQ_INT(count(svg, "fill=\"#4c78a8\""), 3);
    TK_CHECK(strstr(svg, "<script>") == NULL);
    TK_CHECK(strstr(svg, "&lt;script&gt;") != NULL);
    /* the tallest bar reaches the nice maximum 25 -> full plot height 210 */
    TK_CHECK(strstr(svg, "height=\"210.0\"") != NULL);
    free(svg);

    json_t *vl = tk_vegalite_bars("Token lengths", "bin", "count", 3, labels, v);
    TK_CHECK_STR(json_string_value(json_object_get(vl, "$schema")),
                 "https://vega.github.io/schema/vega-lite/v5.json");
    TK_CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(vl, "data"), "values")), 3);
    json_decref(vl);
}

static void test_svg_lines(void) {
    double x[] = {0, 1, 2, 3};
    double y[] = {1, 2, 3, 4, 2, 3, 4, 5};
    const char *names[] = {"allocated", "reserved"};
    char *svg = tk_svg_lines("Memory", "step", "MiB", 4, x, 2, names, y);
    TK_CHECK_EQ_INT(count(svg, "<polyline"), 2);
    TK_CHECK(strstr(svg, ">allocated</text>") != NULL);
    free(svg);
    json_t *vl = tk_vegalite_lines("Memory", "step", "MiB", 4, x, 2, names, y);
    TK_CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(vl, "data"), "values")), 8);
    json_decref(vl);
}

static void test_progress_and_bundle(void) {
    char *p = tk_text_progress(0.5, 10, "epoch 1/3");
    TK_CHECK_STR(p, "[#####.....]  50%  epoch 1/3");
    free(p);
    p = tk_text_progress(7, 4, "");
    TK_CHECK_STR(p, "[####] 100%  ");
    free(p);
    p = tk_html_progress(0.25, "loss <0.5>");
    TK_CHECK(strstr(p, "value=\"0.2500\"") && strstr(p, "loss &lt;0.5&gt;"));
    free(p);
    json_t *b = tk_bundle_new("hello");
    tk_bundle_take(b, "text/html", strdup("<b>hello</b>"));
    tk_bundle_take(b, "image/svg+xml", NULL);
    TK_CHECK_EQ_INT(json_object_size(b), 2);
    TK_CHECK_STR(json_string_value(json_object_get(b, "text/plain")), "hello");
    json_decref(b);
    char buf[32];
    TK_CHECK_STR(tk_render_bytes(24u << 20, buf), "24.00 MiB");
}

/* The notebook copy moves application/json to the vendor type and leaves
 * the caller's bundle alone (the session and `txk --json` still read it). */
static void test_bundle_for_notebook(void) {
    json_t *b = tk_bundle_new("text");
    tk_bundle_take(b, "text/html", strdup("<p>x</p>"));
    tk_bundle_take_json(b, "application/json", json_pack("{s:i}", "fits", 0));
    json_t *n = tk_bundle_for_notebook(b, "plan");
    TK_CHECK(n && !json_object_get(n, "application/json"));
    TK_CHECK(n && json_integer_value(json_object_get(json_object_get(n, "application/vnd.txkernel.plan+json"), "fits")) == 0);
    TK_CHECK(n && !strcmp(json_string_value(json_object_get(n, "text/html")), "<p>x</p>"));
    TK_CHECK(json_object_get(b, "application/json") && !json_object_get(b, "application/vnd.txkernel.plan+json"));
    json_decref(n);
    /* a bundle without a machine-readable part is copied as it is */
    json_t *plain = tk_bundle_new("only text");
    n = tk_bundle_for_notebook(plain, "plan");
    TK_CHECK(n && json_object_size(n) == 1);
    json_decref(n);
    json_decref(plain);
    json_decref(b);
}

int main(void) {
    TK_RUN(test_table_text_and_html);
    TK_RUN(test_svg_bars);
    TK_RUN(test_svg_lines);
    TK_RUN(test_progress_and_bundle);
    TK_RUN(test_bundle_for_notebook);
    return tk_test_done();
}
