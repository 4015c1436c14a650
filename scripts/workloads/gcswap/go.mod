module gostw.test/gcswap

go 1.19
