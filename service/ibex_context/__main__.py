from ibex_context.cli import main

main()
