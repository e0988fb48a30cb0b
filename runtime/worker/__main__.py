from runtime.worker.cli import exit_process, main

exit_process(main())
