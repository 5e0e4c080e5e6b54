=== silk_off: env [SILK_DISABLE_L0_HIGHPRI=1] flags: --silk_pause_compaction=false --dynamic_compaction_rate=false ===
/tmp/anchors/silk/src/db_bench --db=/tmp/anchors/silk/db --benchmarks=longpeak --threads=15 --duration=120 --longpeak_warmup_s=0 --longpeak_valley_s=10 --longpeak_peak_s=50 --value_size=1024 --num=5000000 --compression_type=none --bloom_bits=10 --write_buffer_size=67108864 --max_write_buffer_number=4 --max_background_compactions=2 --max_background_flushes=2 --use_direct_io_for_flush_and_compaction=true --use_direct_reads=true --histogram=1 --stats_interval=100 --stats_interval_seconds=1 --SILK_bandwidth_check_interval=10000 --ops_between_duration_checks=1 --silk_pause_compaction=false --dynamic_compaction_rate=false
rc=0 wall=121s
1.3G	/tmp/anchors/silk/db
