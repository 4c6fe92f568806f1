from mmspec_cli import main

main()
