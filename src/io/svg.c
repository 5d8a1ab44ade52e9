/*
 * svg.c - small line charts as SVG (loss and accuracy curves next to a
 * checkpoint), with no dependency: panels side by side, linear axes with
 * five ticks, one colour per series.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "zs/io.h"

#define PW 480.0 /* panel width and height in px */
#define PH 320.0
#define ML 60.0  /* margins */
#define MR 20.0
#define MT 40.0
#define MB 40.0

static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                               "#9467bd", "#8c564b"};

typedef struct range {
    double x0, x1, y0, y1;
} range;

static range panel_range(int p, int ns, const zs_plot_series *s)
{
    range r = {INFINITY, -INFINITY, INFINITY, -INFINITY};
    for (int i = 0; i < ns; i++) {
        if (s[i].panel != p)
            continue;
        for (int64_t k = 0; k < s[i].n; k++) {
            double x = s[i].x[k], y = s[i].y[k];
            if (!isfinite(x) || !isfinite(y))
                continue;
            r.x0 = fmin(r.x0, x);
            r.x1 = fmax(r.x1, x);
            r.y0 = fmin(r.y0, y);
            r.y1 = fmax(r.y1, y);
        }
    }
    if (!(r.x0 <= r.x1)) {
        r.x0 = 0;
        r.x1 = 1;
    }
    if (!(r.y0 <= r.y1)) {
        r.y0 = 0;
        r.y1 = 1;
    }
    if (r.x1 == r.x0)
        r.x1 = r.x0 + 1;
    if (r.y1 == r.y0)
        r.y1 = r.y0 + 1;
    return r;
}

static void draw_panel(FILE *f, int p, const char *title, int ns,
                       const zs_plot_series *s)
{
    range r = panel_range(p, ns, s);
    double ox = p * PW;
    fprintf(f, "<g transform=\"translate(%.0f,0)\">\n", ox);
    fprintf(f, "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" "
            "font-size=\"15\">%s</text>\n", PW / 2, title ? title : "");
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
            "fill=\"none\" stroke=\"#444\"/>\n", ML, MT, PW - ML - MR, PH - MT - MB);
    for (int t = 0; t <= 4; t++) {
        double fx = r.x0 + (r.x1 - r.x0) * t / 4, fy = r.y0 + (r.y1 - r.y0) * t / 4;
        double px = ML + (PW - ML - MR) * t / 4, py = PH - MB - (PH - MT - MB) * t / 4;
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" "
                "font-size=\"11\">%.4g</text>\n", px, PH - MB + 16, fx);
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" "
                "font-size=\"11\">%.4g</text>\n", ML - 4, py + 4, fy);
        fprintf(f, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" "
                "stroke=\"#ddd\"/>\n", ML, PW - MR, py, py);
    }
    int legend = 0;
    for (int i = 0; i < ns; i++) {
        if (s[i].panel != p)
            continue;
        const char *c = colors[i % 6];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                "points=\"", c);
        for (int64_t k = 0; k < s[i].n; k++) {
            double x = s[i].x[k], y = s[i].y[k];
            if (!isfinite(x) || !isfinite(y))
                continue;
            double px = ML + (PW - ML - MR) * (x - r.x0) / (r.x1 - r.x0);
            double py = PH - MB - (PH - MT - MB) * (y - r.y0) / (r.y1 - r.y0);
            fprintf(f, "%.1f,%.1f ", px, py);
        }
        fprintf(f, "\"/>\n<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" "
                "fill=\"%s\">%s</text>\n", PW - MR - 150, MT + 16 + 16 * legend,
                c, s[i].name ? s[i].name : "");
        legend++;
    }
    fprintf(f, "</g>\n");
}

zs_status zs_svg_plot(const char *path, const char *title, int npanels,
                      const char *const *panel_titles, int nseries,
                      const zs_plot_series *series)
{
    if (npanels < 1 || nseries < 0)
        return zs_set_error("svg: %d panels, %d series", npanels, nseries);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return zs_set_error_code(ZS_ERR_IO, "svg: cannot create %s: %s", tmp,
                                 strerror(errno));
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
            "height=\"%.0f\" font-family=\"sans-serif\">\n<title>%s</title>\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            PW * npanels, PH, title ? title : "");
    for (int p = 0; p < npanels; p++)
        draw_panel(f, p, panel_titles ? panel_titles[p] : NULL, nseries, series);
    fprintf(f, "</svg>\n");
    bool ok = !ferror(f);
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return zs_set_error_code(ZS_ERR_IO, "svg: cannot write %s", path);
    }
    return ZS_OK;
}
