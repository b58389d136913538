# Plot of one bench/scaling.py run. Variables set by the caller with -e:
#   csv   the run's CSV (time,queued,inflight,idle,busy,retiring,desired,starting,processes,completed)
#   png   output file
#   ttl   title
#   tlast time of the last result (s after the first submit)
#   tmin  time the pool was back at its minimum (< 0: not applicable)
set terminal pngcairo size 1100,760 font ",10"
set output png
set datafile separator ","
set datafile missing ""
set key autotitle columnhead outside right top
set grid
set multiplot layout 2,1 title ttl

set style line 1 lc rgb "#d62728" lw 2
set style line 2 lc rgb "#ff7f0e" lw 2
set arrow 1 from first 0, graph 0 to first 0, graph 1 nohead dt 2 lc rgb "#555555"
set arrow 2 from first tlast, graph 0 to first tlast, graph 1 nohead dt 2 lc rgb "#2ca02c"
if (tmin >= 0) set arrow 3 from first tmin, graph 0 to first tmin, graph 1 nohead dt 3 lc rgb "#9467bd"

set ylabel "batches"
set xlabel ""
set format x ""
set lmargin 10
plot csv using 1:2 with lines ls 1 title "queued", \
     csv using 1:3 with lines ls 2 title "in flight"

set format x "%g"
set xlabel "seconds since the first batch was submitted (dashed: first submit, last result, back at minimum)"
set ylabel "workers"
set yrange [0:*]
set style fill solid 0.85 noborder
# Stacked by state: busy at the bottom, then idle, then retiring.
plot csv using 1:($5+$4+$6) with filledcurves x1 lc rgb "#9467bd" title "retiring", \
     csv using 1:($5+$4) with filledcurves x1 lc rgb "#1f77b4" title "idle", \
     csv using 1:5 with filledcurves x1 lc rgb "#2ca02c" title "busy", \
     csv using 1:7 with steps lw 2 lc rgb "#000000" title "desired", \
     csv using 1:8 with steps lw 1 dt 2 lc rgb "#8c564b" title "starting", \
     csv using 1:9 with steps lw 1 dt 3 lc rgb "#e377c2" title "processes"
unset multiplot
