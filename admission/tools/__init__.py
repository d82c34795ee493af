"""The package's tools, imported only by the CLI commands that use them (and the tests): the demo,
the benchmark, the simulator, the fence's fault-injection report and the local servers they start.
`import admission` never imports this package."""
