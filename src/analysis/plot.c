/* PNG plots of the head statistics with cairo (analysis.h: an_plot_all). Built only when CMake
 * found cairo (MOH_HAVE_CAIRO); otherwise an_plot_all reports that plots are unavailable. */
#include "analysis/analysis.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MOH_HAVE_CAIRO
#include <cairo.h>
#include <fontconfig/fontconfig.h>

typedef struct rgb {
    double r, g, b;
} rgb;

/* matplotlib "tab10" */
static const rgb PALETTE[10] = {{0.122, 0.467, 0.706}, {1.000, 0.498, 0.055}, {0.173, 0.627, 0.173},
                                {0.839, 0.153, 0.157}, {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294},
                                {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498}, {0.737, 0.741, 0.133},
                                {0.090, 0.745, 0.812}};
static const rgb GREY = {0.62, 0.62, 0.62};
static const rgb INK = {0.12, 0.12, 0.12};
static const rgb GRID = {0.88, 0.88, 0.88};
#define FONT "DejaVu Sans"
#define AN_PI 3.14159265358979323846

/* viridis at 0, 1/8, ..., 1 */
static rgb viridis(double t) {
    static const unsigned hex[9] = {0x440154, 0x472c7a, 0x3b518b, 0x2c718e, 0x21908d,
                                    0x27ad81, 0x5cc863, 0xaadc32, 0xfde725};
    if (!(t >= 0)) t = 0;
    if (t > 1) t = 1;
    const double x = t * 8;
    int k = (int)x;
    if (k > 7) k = 7;
    const double f = x - k;
    rgb a = {((hex[k] >> 16) & 255) / 255.0, ((hex[k] >> 8) & 255) / 255.0, (hex[k] & 255) / 255.0};
    rgb b = {((hex[k + 1] >> 16) & 255) / 255.0, ((hex[k + 1] >> 8) & 255) / 255.0, (hex[k + 1] & 255) / 255.0};
    rgb c = {a.r + f * (b.r - a.r), a.g + f * (b.g - a.g), a.b + f * (b.b - a.b)};
    return c;
}

static void set_rgb(cairo_t *cr, rgb c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

/* Text anchored at (x, y): ax = 0 left, 0.5 centre, 1 right; ay = 0 top, 0.5 middle, 1 bottom
 * (of the ink box); rotated by angle (radians) around the anchor. */
static void text(cairo_t *cr, double x, double y, const char *s, double size, bool bold, double ax,
                 double ay, double angle) {
    cairo_save(cr);
    cairo_select_font_face(cr, FONT, CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_translate(cr, x, y);
    cairo_rotate(cr, angle);
    /* vertical placement from the font's cap height, so labels of one row align */
    const double cap = size * 0.72;
    cairo_move_to(cr, -e.x_advance * ax, cap * (1 - ay));
    cairo_show_text(cr, s);
    cairo_restore(cr);
}

static double text_width(cairo_t *cr, const char *s, double size) {
    cairo_save(cr);
    cairo_select_font_face(cr, FONT, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_restore(cr);
    return e.x_advance;
}

static void rect(cairo_t *cr, double x, double y, double w, double h, rgb c) {
    set_rgb(cr, c);
    cairo_rectangle(cr, x, y, w, h);
    cairo_fill(cr);
}

static void line(cairo_t *cr, double x0, double y0, double x1, double y1, rgb c, double width) {
    set_rgb(cr, c);
    cairo_set_line_width(cr, width);
    cairo_move_to(cr, x0, y0);
    cairo_line_to(cr, x1, y1);
    cairo_stroke(cr);
}

/* Decimals of tick labels at this step. */
static int tick_decimals(double step) {
    const int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    return dec > 6 ? 6 : dec;
}

static void fmt_tick(char *buf, size_t cap, double v, double step) {
    if (fabs(v) < 1e-9 * step) v = 0; /* no "-0.0" */
    snprintf(buf, cap, "%.*f", tick_decimals(step), v);
}

/* A value label on an axis of this tick step: 3 significant digits, within 1 or 2 decimals more
 * than the ticks. */
static void fmt_value(char *buf, size_t cap, double v, double step) {
    const int lo = tick_decimals(step) + 1;
    int dec = v != 0 && isfinite(v) ? 2 - (int)floor(log10(fabs(v))) : lo;
    dec = dec < lo ? lo : dec > lo + 1 ? lo + 1 : dec;
    snprintf(buf, cap, "%.*f", dec, v);
}

/* A plot area: data y range [lo, hi] mapped onto pixels [y0 + h, y0]; ticks every step (0: a
 * step from an_nice_step). */
typedef struct frame {
    double x, y, w, h, lo, hi, step;
} frame;

static double fy(const frame *f, double v) {
    if (v < f->lo) v = f->lo;
    if (v > f->hi) v = f->hi;
    return f->y + f->h - (v - f->lo) / (f->hi - f->lo) * f->h;
}

/* Horizontal grid lines, y tick labels, the frame's left and bottom axes and a y-axis title. */
static void y_axis(cairo_t *cr, const frame *f, const char *title, double fs, int nticks) {
    const double step = f->step > 0 ? f->step : an_nice_step(f->hi - f->lo, nticks);
    char buf[32];
    double maxw = 0;
    for (double v = ceil(f->lo / step - 1e-9) * step; v <= f->hi + 1e-9 * step; v += step) {
        const double y = fy(f, v);
        line(cr, f->x, y, f->x + f->w, y, GRID, 1);
        fmt_tick(buf, sizeof buf, v, step);
        set_rgb(cr, INK);
        text(cr, f->x - 5, y, buf, fs, false, 1, 0.5, 0);
        const double w = text_width(cr, buf, fs);
        if (w > maxw) maxw = w;
    }
    line(cr, f->x, f->y, f->x, f->y + f->h, INK, 1);
    line(cr, f->x, f->y + f->h, f->x + f->w, f->y + f->h, INK, 1);
    if (title) {
        set_rgb(cr, INK);
        text(cr, f->x - 5 - maxw - 8, f->y + f->h / 2, title, fs, false, 0.5, 1,
             -AN_PI / 2);
    }
}

static cairo_t *canvas(int w, int h, cairo_surface_t **surf) {
    *surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h);
    cairo_t *cr = cairo_create(*surf);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    return cr;
}

static int save_path(cairo_t *cr, cairo_surface_t *surf, const char *path, moh_error *err);
static int save(cairo_t *cr, cairo_surface_t *surf, const char *dir, const char *name, moh_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return save_path(cr, surf, path, err);
}

static int save_path(cairo_t *cr, cairo_surface_t *surf, const char *path, moh_error *err) {
    const cairo_status_t cst = cairo_status(cr);
    cairo_destroy(cr);
    char tmp[4200]; /* written aside, then renamed: an error never leaves a truncated PNG */
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cairo_status_t st = cst ? cst : cairo_surface_write_to_png(surf, tmp);
    cairo_surface_destroy(surf);
    if (st != CAIRO_STATUS_SUCCESS) {
        remove(tmp);
        return moh_fail(err, MOH_E_IO, "%s: cannot write PNG: %s", path, cairo_status_to_string(st));
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        remove(tmp);
        return moh_fail(err, MOH_E_IO, "%s: cannot write PNG: %s", path, strerror(e));
    }
    return MOH_OK;
}

/* Legend entries (filled squares) in a row starting at (x, y); returns the x after the last. */
static double legend(cairo_t *cr, double x, double y, const char *const *labels, const rgb *colors,
                     int n, double fs) {
    for (int k = 0; k < n; k++) {
        rect(cr, x, y - fs * 0.45, fs, fs, colors[k]);
        set_rgb(cr, INK);
        text(cr, x + fs + 5, y, labels[k], fs, false, 0, 0.5, 0);
        x += fs + 5 + text_width(cr, labels[k], fs) + 18;
    }
    return x;
}

static double legend_width(cairo_t *cr, const char *const *labels, int n, double fs) {
    double w = 0;
    for (int k = 0; k < n; k++) w += fs + 5 + text_width(cr, labels[k], fs) + 18;
    return w - 18;
}

/* ---- Figure 3: head load per category, final analysed layer ---------------------------------- */

static int plot_load(const char *dir, const an_meta *m, const an_result *r, moh_error *err) {
    const an_shape *s = &r->s;
    const int L = s->layers, h = s->heads, C = s->categories;
    const int n = C < 12 ? C : 12;
    const int cols = n <= 4 ? n : n <= 6 ? 3 : n <= 8 ? 4 : 5, rows = (n + cols - 1) / cols;
    const double pw = 250, ph = 185, top = 78, left = 20;
    const int W = (int)(left + cols * pw + 20), H = (int)(top + rows * ph + 8);
    cairo_surface_t *surf;
    cairo_t *cr = canvas(W, H, &surf);
    const an_layer_result *y = &r->layer[L - 1];
    const int kf = m->layer_top_k ? m->layer_top_k[L - 1] : m->top_k;            /* the final layer's */
    const int ef = m->layer_shared ? h - m->layer_shared[L - 1] : s->routed;
    char buf[256];
    set_rgb(cr, INK);
    snprintf(buf, sizeof buf, "Head load per category, layer %d (%s)", m->layer_index[L - 1],
             m->model_type);
    text(cr, W / 2.0, 14, buf, 17, true, 0.5, 0, 0);
    snprintf(buf, sizeof buf, "share of the category's tokens that select each head; dashed: K/E = %d/%d%s",
             kf, ef, C > n ? "; first 12 categories shown" : "");
    text(cr, W / 2.0, 38, buf, 12, false, 0.5, 0, 0);
    const char *lab[2] = {"shared heads (always on)", "routed heads"};
    const rgb col[2] = {GREY, PALETTE[0]};
    legend(cr, W / 2.0 - legend_width(cr, lab, 2, 12) / 2, 64, lab, col, 2, 12);
    for (int k = 0; k < n; k++) {
        const int pr = k / cols, pc = k % cols;
        frame f = {left + pc * pw + 44, top + pr * ph + 24, pw - 58, ph - 58, 0, 1, 0};
        set_rgb(cr, INK);
        text(cr, f.x + f.w / 2, f.y - 18, m->categories[k], 13, true, 0.5, 0, 0);
        y_axis(cr, &f, k % cols == 0 ? "load" : NULL, 10, 4);
        const double bw = f.w / h;
        for (int i = 0; i < h; i++) {
            const double v = y->density[(size_t)i * C + k];
            if (isfinite(v)) rect(cr, f.x + i * bw + bw * 0.12, fy(&f, v), bw * 0.76, f.y + f.h - fy(&f, v),
                                  i < h - ef ? GREY : PALETTE[0]);
            snprintf(buf, sizeof buf, "%d", i);
            set_rgb(cr, INK);
            text(cr, f.x + (i + 0.5) * bw, f.y + f.h + 4, buf, 9.5, false, 0.5, 0, 0);
        }
        if (ef > 0 && kf > 0) {
            const double u = fy(&f, (double)kf / ef);
            cairo_save(cr);
            const double dash[2] = {4, 3};
            cairo_set_dash(cr, dash, 2, 0);
            line(cr, f.x + (h - ef) * bw, u, f.x + f.w, u, INK, 0.8);
            cairo_restore(cr);
        }
        if (pr == rows - 1 || k + cols >= n) {
            set_rgb(cr, INK);
            text(cr, f.x + f.w / 2, f.y + f.h + 17, "head", 10.5, false, 0.5, 0, 0);
        }
    }
    return save(cr, surf, dir, "load_final_layer.png", err);
}

/* ---- heat map: routed-head load x category, one layer ----------------------------------------- */

static int plot_heatmap(const char *dir, const an_meta *m, const an_result *r, int l, moh_error *err) {
    const an_shape *s = &r->s;
    const int hs = s->shared, E = s->routed, C = s->categories;
    const an_layer_result *y = &r->layer[l];
    cairo_surface_t *tmp = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 4, 4);
    cairo_t *mc = cairo_create(tmp);
    double maxlab = 0;
    for (int c = 0; c < C; c++) {
        const double w = text_width(mc, m->categories[c], 12);
        if (w > maxlab) maxlab = w;
    }
    char sub[256], shared[64];
    const int hl = m->layer_shared ? m->layer_shared[l] : hs, kl = m->layer_top_k ? m->layer_top_k[l] : m->top_k;
    if (hl == 0) snprintf(shared, sizeof shared, "no shared heads");
    else if (hl == 1) snprintf(shared, sizeof shared, "shared head 0 always on");
    else snprintf(shared, sizeof shared, "shared heads 0-%d always on", hl - 1);
    snprintf(sub, sizeof sub, "colour: share of the category's tokens that select the head (top-%d of %d routed; %s)",
             kl, s->heads - hl, shared);
    const double subw = text_width(mc, sub, 11);
    cairo_destroy(mc);
    cairo_surface_destroy(tmp);
    const double cw = C <= 6 ? 90 : C <= 12 ? 64 : C <= 24 ? 40 : 28, ch = 34;
    const bool rot = cw < maxlab + 8;
    const double bottom = (rot ? maxlab * 0.72 + 16 : 24) + 34;
    const double left = 90, top = 74, cbw = 18;
    const double gw = C * cw, gh = E * ch;
    double W = left + gw + 110, Hh = top + gh + bottom;
    if (W < 620) W = 620;
    if (W < subw + 24) W = subw + 24; /* the subtitle inside the picture */
    cairo_surface_t *surf;
    cairo_t *cr = canvas((int)W, (int)Hh, &surf);
    double lo = INFINITY, hi = -INFINITY;
    for (int e = 0; e < E; e++)
        for (int c = 0; c < C; c++) {
            const double v = y->density[(size_t)(hs + e) * C + c];
            if (isfinite(v)) {
                if (v < lo) lo = v;
                if (v > hi) hi = v;
            }
        }
    if (!(hi > lo)) {
        lo = isfinite(lo) ? lo - 0.05 : 0;
        hi = lo + 0.1;
    }
    char buf[256];
    set_rgb(cr, INK);
    snprintf(buf, sizeof buf, "Routed-head load by category, layer %d (%s)", m->layer_index[l], m->model_type);
    text(cr, W / 2, 14, buf, 16, true, 0.5, 0, 0);
    text(cr, W / 2, 38, sub, 11, false, 0.5, 0, 0);
    const double gx = left, gy = top;
    for (int e = 0; e < E; e++) {
        for (int c = 0; c < C; c++) {
            const double v = y->density[(size_t)(hs + e) * C + c];
            const double t = (v - lo) / (hi - lo);
            rect(cr, gx + c * cw, gy + e * ch, cw - 1, ch - 1, isfinite(v) ? viridis(t) : GRID);
            if (cw >= 40 && isfinite(v)) {
                snprintf(buf, sizeof buf, "%.2f", v);
                cairo_set_source_rgb(cr, t > 0.6 ? 0 : 1, t > 0.6 ? 0 : 1, t > 0.6 ? 0 : 1);
                text(cr, gx + (c + 0.5) * cw, gy + (e + 0.5) * ch, buf, 10.5, false, 0.5, 0.5, 0);
            }
        }
        snprintf(buf, sizeof buf, "head %d", hs + e);
        set_rgb(cr, INK);
        text(cr, gx - 8, gy + (e + 0.5) * ch, buf, 12, false, 1, 0.5, 0);
    }
    for (int c = 0; c < C; c++) {
        set_rgb(cr, INK);
        if (rot) text(cr, gx + (c + 0.5) * cw + 4, gy + gh + 6, m->categories[c], 12, false, 1, 0.5, -AN_PI / 4);
        else text(cr, gx + (c + 0.5) * cw, gy + gh + 6, m->categories[c], 12, false, 0.5, 0, 0);
    }
    set_rgb(cr, INK);
    text(cr, gx + gw / 2, Hh - 20, "category", 12.5, false, 0.5, 0, 0);
    /* colour bar */
    const double bx = gx + gw + 22;
    for (int k = 0; k < (int)gh; k++) rect(cr, bx, gy + gh - k - 1, cbw, 1.2, viridis((k + 0.5) / gh));
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_line_width(cr, 0.8);
    cairo_rectangle(cr, bx, gy, cbw, gh);
    cairo_stroke(cr);
    const double step = an_nice_step(hi - lo, 4);
    for (double v = ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step) {
        const double yy = gy + gh - (v - lo) / (hi - lo) * gh;
        line(cr, bx + cbw, yy, bx + cbw + 4, yy, INK, 1);
        fmt_tick(buf, sizeof buf, v, step);
        set_rgb(cr, INK);
        text(cr, bx + cbw + 7, yy, buf, 10.5, false, 0, 0.5, 0);
    }
    text(cr, bx + cbw / 2, gy - 8, "load", 11, false, 0.5, 1, 0);
    snprintf(buf, sizeof buf, "heatmap_layer%02d.png", m->layer_index[l]);
    return save(cr, surf, dir, buf, err);
}

/* ---- routing-score box plots, one layer ------------------------------------------------------ */

static int plot_scores(const char *dir, const an_meta *m, const analysis *an, const an_result *r, int l,
                       moh_error *err) {
    const an_shape *s = &r->s;
    const int h = s->heads, hs = s->shared, nc = s->categories < 4 ? s->categories : 4;
    const bool more = s->categories > nc; /* one more subtitle line, legend moved down */
    const double gw = nc * 18 + 22, left = 70, top = more ? 106 : 92;
    const double W = left + h * gw + 30 < 760 ? 760 : left + h * gw + 30, Hh = more ? 484 : 470;
    cairo_surface_t *surf;
    cairo_t *cr = canvas((int)W, (int)Hh, &surf);
    double hi = 0;
    for (int i = 0; i < h; i++)
        for (int c = 0; c < nc; c++) {
            const double v = an_score_quantile(an, l, i, c, 0.95);
            if (isfinite(v) && v > hi) hi = v;
        }
    frame f = {left, top, h * gw, Hh - top - 64, 0, 1, 0};
    an_axis_range(&hi, 1, 0.03, 6, &f.lo, &f.hi, &f.step);
    char buf[256];
    set_rgb(cr, INK);
    snprintf(buf, sizeof buf, "Routing scores per head, layer %d (%s)", m->layer_index[l], m->model_type);
    text(cr, W / 2, 14, buf, 16, true, 0.5, 0, 0);
    text(cr, W / 2, 38,
         "gate values: shared heads over all tokens, routed heads over the tokens that select them;"
         " box 25-75 %, line median, whiskers 5-95 %", 11, false, 0.5, 0, 0);
    if (more) {
        snprintf(buf, sizeof buf, "first %d of %d categories shown (all of them: scores.csv)", nc, s->categories);
        text(cr, W / 2, 54, buf, 11, false, 0.5, 0, 0);
    }
    rgb cols[4];
    for (int c = 0; c < nc; c++) cols[c] = PALETTE[c];
    legend(cr, W / 2 - legend_width(cr, m->categories, nc, 11.5) / 2, more ? 78 : 64, m->categories, cols, nc,
           11.5);
    y_axis(cr, &f, "gate value", 10.5, 6);
    for (int i = 0; i < h; i++) {
        if (i == hs && hs > 0) {
            cairo_save(cr);
            const double dash[2] = {3, 3};
            cairo_set_dash(cr, dash, 2, 0);
            line(cr, f.x + i * gw, f.y, f.x + i * gw, f.y + f.h, GREY, 1);
            cairo_restore(cr);
        }
        for (int c = 0; c < nc; c++) {
            const double q05 = an_score_quantile(an, l, i, c, 0.05), q25 = an_score_quantile(an, l, i, c, 0.25);
            const double q50 = an_score_quantile(an, l, i, c, 0.5), q75 = an_score_quantile(an, l, i, c, 0.75);
            const double q95 = an_score_quantile(an, l, i, c, 0.95);
            if (!isfinite(q50)) continue;
            const double x = f.x + i * gw + 11 + c * 18, bw = 14, xc = x + bw / 2;
            line(cr, xc, fy(&f, q05), xc, fy(&f, q95), cols[c], 1.2);
            line(cr, xc - 4, fy(&f, q05), xc + 4, fy(&f, q05), cols[c], 1.2);
            line(cr, xc - 4, fy(&f, q95), xc + 4, fy(&f, q95), cols[c], 1.2);
            const double y1 = fy(&f, q75), y0 = fy(&f, q25);
            rect(cr, x, y1, bw, (y0 - y1) < 1.5 ? 1.5 : y0 - y1, cols[c]);
            line(cr, x, fy(&f, q50), x + bw, fy(&f, q50), INK, 1.6);
        }
        snprintf(buf, sizeof buf, "%d%s", i, s->routed == 0 ? "" : i < hs ? " (s)" : "");
        set_rgb(cr, INK);
        text(cr, f.x + (i + 0.5) * gw, f.y + f.h + 6, buf, 11, false, 0.5, 0, 0);
    }
    set_rgb(cr, INK);
    text(cr, f.x + f.w / 2, f.y + f.h + 26, hs && s->routed ? "head ((s) = shared)" : "head", 12, false, 0.5, 0, 0);
    snprintf(buf, sizeof buf, "scores_layer%02d.png", m->layer_index[l]);
    return save(cr, surf, dir, buf, err);
}

/* ---- grouped bars per layer (similarity, effective rank) ------------------------------------- */

typedef struct series {
    const char *label;
    rgb color;
    double v[65]; /* per layer, then the mean in v[L] */
} series;

/* Mean-group value label of v on f (vertical or not); *w its width in pixels. */
static void mean_label(cairo_t *cr, const frame *f, double v, char *buf, size_t cap, double *w) {
    fmt_value(buf, cap, v, f->step);
    *w = text_width(cr, buf, 9.5);
}

/* Sets f's value range and ticks from the data of sr (an_axis_range), widened until the value
 * labels of the mean group fit inside the frame beyond their bars; returns whether those labels
 * are drawn vertically (when any is wider than its bar). */
static bool bar_axis(cairo_t *cr, frame *f, const series *sr, int ns, int L, bool with_mean, int nticks) {
    const int ng = L + (with_mean ? 1 : 0);
    const double bw = f->w / ng * 0.8 / ns;
    double vals[3 * 65];
    int n = 0;
    for (int k = 0; k < ns && k < 3; k++)
        for (int g = 0; g < ng; g++) vals[n++] = sr[k].v[g];
    double pad = 0.02;
    bool vertical = false;
    for (int it = 0; it < 16; it++, pad = pad * 1.5 + 0.02) {
        an_axis_range(vals, n, pad, nticks, &f->lo, &f->hi, &f->step);
        if (!with_mean) return false;
        char buf[32];
        double maxw = 0, w;
        for (int k = 0; k < ns; k++)
            if (isfinite(sr[k].v[L])) {
                mean_label(cr, f, sr[k].v[L], buf, sizeof buf, &w);
                if (w > maxw) maxw = w;
            }
        vertical = maxw + 2 > bw;
        const double need = (vertical ? maxw : 9.5 * 0.75) + 5, px = f->h / (f->hi - f->lo);
        bool fits = true;
        for (int k = 0; k < ns; k++) {
            const double v = sr[k].v[L];
            if (isfinite(v) && (v >= 0 ? (f->hi - v) * px : (v - f->lo) * px) < need) fits = false;
        }
        if (fits) break;
    }
    return vertical;
}

/* Grouped bars per layer (and the mean over layers when with_mean, labelled with its values) in f,
 * whose value range comes from the data (bar_axis). */
static void bar_panel(cairo_t *cr, frame *f, const char *title, const char *ytitle, const series *sr,
                      int ns, int L, const int *layer_index, bool with_mean) {
    const bool vertical = bar_axis(cr, f, sr, ns, L, with_mean, 5);
    set_rgb(cr, INK);
    text(cr, f->x + f->w / 2, f->y - 26, title, 13.5, true, 0.5, 0, 0);
    y_axis(cr, f, ytitle, 10.5, 5);
    if (f->lo < 0) line(cr, f->x, fy(f, 0), f->x + f->w, fy(f, 0), INK, 0.8);
    const int ng = L + (with_mean ? 1 : 0);
    const double gw = f->w / ng, bw = gw * 0.8 / ns;
    char buf[32];
    for (int g = 0; g < ng; g++) {
        for (int k = 0; k < ns; k++) {
            const double v = sr[k].v[g];
            if (!isfinite(v)) continue;
            const double x = f->x + g * gw + gw * 0.1 + k * bw, y0 = fy(f, 0), y1 = fy(f, v);
            rect(cr, x, y1 < y0 ? y1 : y0, bw * 0.92, fabs(y0 - y1), sr[k].color);
            if (g == L && with_mean) {
                double w;
                mean_label(cr, f, v, buf, sizeof buf, &w);
                set_rgb(cr, INK);
                if (vertical)
                    text(cr, x + bw * 0.46, v >= 0 ? y1 - 3 : y1 + 3, buf, 9.5, false, v >= 0 ? 0 : 1, 0.5,
                         -AN_PI / 2);
                else if (v >= 0) text(cr, x + bw * 0.46, y1 - 3, buf, 9.5, false, 0.5, 1, 0);
                else text(cr, x + bw * 0.46, y1 + 3, buf, 9.5, false, 0.5, 0, 0);
            }
        }
        if (g < L) snprintf(buf, sizeof buf, "%d", layer_index[g]);
        else snprintf(buf, sizeof buf, "mean");
        set_rgb(cr, INK);
        text(cr, f->x + (g + 0.5) * gw, f->y + f->h + 6, buf, 11, g == L, 0.5, 0, 0);
    }
    text(cr, f->x + f->w / 2, f->y + f->h + 24, "layer", 11.5, false, 0.5, 0, 0);
}

static void fill_series(series *sr, const an_result *r, size_t offset) {
    double sum = 0;
    int n = 0;
    for (int l = 0; l < r->s.layers && l < 64; l++) {
        const double v = *(const double *)((const char *)&r->layer[l] + offset);
        sr->v[l] = v;
        if (isfinite(v)) {
            sum += v;
            n++;
        }
    }
    sr->v[r->s.layers < 64 ? r->s.layers : 64] = n ? sum / n : NAN;
}

static int plot_similarity(const char *dir, const an_meta *m, const an_result *r, const an_result *cmp,
                           moh_error *err) {
    const int L = r->s.layers < 64 ? r->s.layers : 64;
    const bool twin = cmp && cmp->s.layers == r->s.layers, routed = r->s.routed > 0;
    const double pw = 560, ph = 300, top = 100, W = 2 * pw + 60, Hh = top + ph + 4;
    cairo_surface_t *surf;
    cairo_t *cr = canvas((int)W, (int)Hh, &surf);
    series sr[3];
    memset(sr, 0, sizeof sr);
    int ns = 0, k_all = -1, k_twin = -1;
    sr[ns].label = routed ? "MoH (tokens selecting both heads)" : "model";
    sr[ns++].color = PALETTE[0];
    if (routed) {
        k_all = ns;
        sr[ns].label = "MoH (all tokens)";
        sr[ns++].color = (rgb){0.62, 0.78, 0.91};
    }
    if (twin) {
        k_twin = ns;
        sr[ns].label = "MHA twin";
        sr[ns++].color = PALETTE[1];
    }
    char buf[256];
    set_rgb(cr, INK);
    snprintf(buf, sizeof buf, "Similarity between heads of a layer (%s)%s", m->model_type,
             twin ? ": MoH vs its dense MHA twin" : "");
    text(cr, W / 2, 14, buf, 16, true, 0.5, 0, 0);
    text(cr, W / 2, 38, "mean over head pairs of the mean over tokens", 11.5, false, 0.5, 0, 0);
    const char *lab[3] = {sr[0].label, sr[1].label, sr[2].label};
    const rgb col[3] = {sr[0].color, sr[1].color, sr[2].color};
    legend(cr, W / 2 - legend_width(cr, lab, ns, 12) / 2, 62, lab, col, ns, 12);
    for (int p = 0; p < 2; p++) {
        const size_t off = p ? offsetof(an_layer_result, out_sim.all) : offsetof(an_layer_result, att_sim.all);
        const size_t off_all = p ? offsetof(an_layer_result, out_sim_alltok.all)
                                 : offsetof(an_layer_result, att_sim_alltok.all);
        fill_series(&sr[0], r, off);
        if (k_all >= 0) fill_series(&sr[k_all], r, off_all);
        if (k_twin >= 0) fill_series(&sr[k_twin], cmp, off);
        frame f = {78 + p * (pw + 10), top, pw - 84, ph - 40, 0, 1, 0};
        bar_panel(cr, &f, p ? "Head-output cosine similarity" : "Attention-pattern similarity",
                  p ? "cosine" : "1 - 0.5 E||A - A'||_1", sr, ns, L, m->layer_index, true);
    }
    return save(cr, surf, dir, "similarity.png", err);
}

static int plot_rank(const char *dir, const an_meta *m, const an_result *r, const an_result *cmp,
                     moh_error *err) {
    const int L = r->s.layers < 64 ? r->s.layers : 64;
    const bool twin = cmp && cmp->s.layers == r->s.layers, routed = r->s.routed > 0 && r->s.shared > 0;
    const double W = 760, Hh = 420, top = 80;
    cairo_surface_t *surf;
    cairo_t *cr = canvas((int)W, (int)Hh, &surf);
    series sr[3];
    memset(sr, 0, sizeof sr);
    int ns = 0;
    if (routed) {
        sr[ns].label = "MoH shared heads";
        sr[ns].color = GREY;
        fill_series(&sr[ns++], r, offsetof(an_layer_result, erank_shared));
        sr[ns].label = "MoH routed heads";
        sr[ns].color = PALETTE[0];
        fill_series(&sr[ns++], r, offsetof(an_layer_result, erank_routed));
    } else {
        sr[ns].label = "all heads";
        sr[ns].color = PALETTE[0];
        fill_series(&sr[ns++], r, offsetof(an_layer_result, erank_all));
    }
    if (twin) {
        sr[ns].label = "MHA twin (all heads)";
        sr[ns].color = PALETTE[1];
        fill_series(&sr[ns++], cmp, offsetof(an_layer_result, erank_all));
    }
    char buf[256];
    set_rgb(cr, INK);
    snprintf(buf, sizeof buf, "Effective rank of head outputs (%s, head_dim %d)", m->model_type, r->s.head_dim);
    text(cr, W / 2, 14, buf, 16, true, 0.5, 0, 0);
    text(cr, W / 2, 38, "Roy & Vetterli 2007: exp(entropy of normalised singular values), mean over heads; via Gram eigenvalues",
         11, false, 0.5, 0, 0);
    const char *lab[3] = {sr[0].label, sr[1].label, sr[2].label};
    const rgb col[3] = {sr[0].color, sr[1].color, sr[2].color};
    legend(cr, W / 2 - legend_width(cr, lab, ns, 12) / 2, 62, lab, col, ns, 12);
    frame f = {70, top + 10, W - 100, Hh - top - 70, 0, 1, 0};
    bar_panel(cr, &f, "", "effective rank", sr, ns, L, m->layer_index, true);
    return save(cr, surf, dir, "effective_rank.png", err);
}

bool an_plot_available(void) { return true; }

int plot_image_grid(const char *path, const uint8_t *pix, int nrows, int ncols, int H, int W, int scale,
                    const char *const *labels, moh_error *err) {
    const double fs = 14;
    const int gap = 2 * scale, cw = W * scale, ch = H * scale;
    cairo_surface_t *probe = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1);
    cairo_t *pc = cairo_create(probe);
    double lw = 0;
    for (int r = 0; r < nrows && labels; r++) {
        const double w = text_width(pc, labels[r], fs);
        if (w > lw) lw = w;
    }
    cairo_destroy(pc);
    cairo_surface_destroy(probe);
    const int left = labels ? (int)ceil(lw) + 16 : 0;
    const int GW = left + ncols * (cw + gap) + gap, GH = nrows * (ch + gap) + gap;
    cairo_surface_t *surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, GW, GH);
    const cairo_status_t cs = cairo_surface_status(surf);
    if (cs != CAIRO_STATUS_SUCCESS) { /* e.g. a side over 32767 */
        cairo_surface_destroy(surf);
        cairo_debug_reset_static_data();
        FcFini();
        return moh_fail(err, MOH_E_ARG, "%s: a grid of %d x %d pixels: cairo cannot make it (%s)", path, GW, GH,
                        cairo_status_to_string(cs));
    }
    cairo_t *cr = cairo_create(surf);
    rect(cr, 0, 0, GW, GH, (rgb){1, 1, 1});
    rect(cr, left, 0, GW - left, GH, (rgb){0.25, 0.25, 0.25});
    cairo_surface_flush(surf);
    unsigned char *dst = cairo_image_surface_get_data(surf);
    const int stride = cairo_image_surface_get_stride(surf);
    for (int r = 0; r < nrows; r++)
        for (int c = 0; c < ncols; c++) {
            const uint8_t *img = pix + ((size_t)r * ncols + c) * (size_t)H * W;
            const int x0 = left + gap + c * (cw + gap), y0 = gap + r * (ch + gap);
            for (int y = 0; y < ch; y++) {
                uint32_t *row = (uint32_t *)(void *)(dst + (size_t)(y0 + y) * stride) + x0;
                for (int x = 0; x < cw; x++) {
                    const uint32_t v = img[(size_t)(y / scale) * W + x / scale];
                    row[x] = v << 16 | v << 8 | v;
                }
            }
        }
    cairo_surface_mark_dirty(surf);
    for (int r = 0; r < nrows && labels; r++) {
        set_rgb(cr, INK);
        text(cr, left - 8, gap + r * (ch + gap) + ch / 2.0, labels[r], fs, false, 1, 0.5, 0);
    }
    const int rc = save_path(cr, surf, path, err);
    cairo_debug_reset_static_data();
    FcFini();
    return rc;
}

int an_plot_all(const char *dir, const an_meta *meta, const analysis *an, const an_result *r,
                const an_result *cmp, moh_error *err) {
    int rc = MOH_OK;
    if (r->s.routed > 0) rc = plot_load(dir, meta, r, err);
    for (int l = 0; !rc && l < r->s.layers; l++) {
        if (r->s.routed > 0) rc = plot_heatmap(dir, meta, r, l, err);
        if (!rc) rc = plot_scores(dir, meta, an, r, l, err);
    }
    if (!rc) rc = plot_similarity(dir, meta, r, cmp, err);
    if (!rc) rc = plot_rank(dir, meta, r, cmp, err);
    /* release cairo's and fontconfig's caches (no objects are alive): leak checkers stay quiet */
    cairo_debug_reset_static_data();
    FcFini();
    return rc;
}

#else /* no cairo */

bool an_plot_available(void) { return false; }

int plot_image_grid(const char *path, const uint8_t *pix, int nrows, int ncols, int H, int W, int scale,
                    const char *const *labels, moh_error *err) {
    return moh_fail(err, MOH_E_CONFIG, "%s: no labelled grid: moh was built without cairo", path);
}

int an_plot_all(const char *dir, const an_meta *meta, const analysis *an, const an_result *r,
                const an_result *cmp, moh_error *err) {
    return moh_fail(err, MOH_E_CONFIG,
                    "%s: no plots: moh was built without cairo (install libcairo2-dev, rebuild)", dir);
}
#endif
